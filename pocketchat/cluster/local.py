"""One process (no `--redis-url`): every turn runs here, and there is nobody to tell anything."""

from collections.abc import Callable, Collection
from typing import Any

from pocketchat.conversations import Conversation, NoOtherReplicas, Turn, TurnIds
from pocketchat.limits import Limits, LocalCounters, Taken
from pocketchat.records import new_id
from pocketchat.settings import Settings


class LocalCoordinator(NoOtherReplicas):
    """The coordinator of a process that has no replicas: the hub's part (`NoOtherReplicas`: every
    turn's log is in memory, no conversation is anywhere else), the user's limits counted here, and
    nothing to tell another replica."""

    failure: str | None = None
    stopped: str | None = None
    on_lag: Callable[[float], None] | None = None  # never told: nothing is read from another replica
    on_documents_removed: Callable[[str, str | None], None] | None = None  # never told: no other replica

    def __init__(self, settings: Settings) -> None:
        self.limits = Limits(settings, LocalCounters())
        self.replica = new_id()[:12]

    async def claim(self, conversation: Conversation, ids: TurnIds, user: str) -> Taken:
        # The user's limits only: the conversation itself refuses a second turn.
        return await self.limits.take_message(user)

    async def release_claim(self, conversation: Conversation, taken: Taken) -> None:
        await self.limits.give_back(taken)

    async def started(self, conversation: Conversation, turn: Turn, lease: str) -> None:
        return None

    async def finished(self, conversation: Conversation, turn: Turn) -> None:
        return None

    def stop(self, turn: Turn) -> None:
        turn.stop.set()

    def stop_unseen(self, conversation: Conversation, turn_id: str) -> None:
        return None  # every turn is here: one this process has not seen has ended, or never was

    def changed(self, conversation: Conversation, names: Collection[str]) -> None:
        return None

    def documents_changed(self, conversation_id: str, frame: dict[str, Any]) -> None:
        return None

    def pressed(self, conversation_id: str, frame: dict[str, Any]) -> None:
        return None

    async def hold_for_switch(self, conversation_id: str) -> str | None:
        return None  # one process: its conversation's turn, checked by the switch itself, is the only one

    async def let_go(self, conversation_id: str, held: str | None) -> None:
        return None

    async def deleting(self, conversation_id: str) -> None:
        return None

    async def replica_gone(self, replica: str, quiet_for: float) -> bool:
        return replica != self.replica  # one process: what another wrote, it wrote before this one started

    def deleted(self, conversation_ids: list[str]) -> None:
        return None

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
