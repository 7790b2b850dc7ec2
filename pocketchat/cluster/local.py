"""One process (no `--redis-url`): every turn runs here, and there is nobody to tell anything."""

from collections.abc import Collection

from pocketchat.conversations import Conversation, Turn, TurnIds
from pocketchat.limits import Limits, LocalCounters, Taken
from pocketchat.records import ConversationRecord
from pocketchat.settings import Settings
from pocketchat.turn_log import InProcessTurnLog, TurnLog


class LocalCoordinator:
    """One process: every turn is local, and there is nobody to tell anything."""

    failure: str | None = None
    stopped: str | None = None

    def __init__(self, settings: Settings) -> None:
        self.limits = Limits(settings, LocalCounters())

    def new_log(self, turn_id: str) -> TurnLog:
        return InProcessTurnLog(turn_id)

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

    async def adopt(self, conversation: Conversation) -> None:
        return None

    async def remember_new(self, record: ConversationRecord) -> None:
        return None

    def refresh_new(self, record: ConversationRecord) -> None:
        return None

    async def find_new(self, conversation_id: str) -> ConversationRecord | None:
        return None

    def changed(self, conversation: Conversation, names: Collection[str]) -> None:
        return None

    async def deleting(self, conversation_id: str) -> None:
        return None

    def deleted(self, conversation_id: str) -> None:
        return None

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
