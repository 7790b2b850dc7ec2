"""Replicas, or none: one `Coordinator` interface for one process (`local.py`) and for several
replicas linked through Redis (`replicas.py`). The app calls it wherever another replica may need to
know or act: a turn claimed, started, finished or stopped; a conversation loaded, made, changed or
deleted.

The parts, for replicas: `replicas.py` (the coordinator: its lifecycle, the turns that run here, the
events, the new conversations), `mirrors.py` (turns that run elsewhere, followed here), `reader.py`
(the one blocking read of Redis), `watchdog.py` (a dead replica's turns ended), `produced_log.py` (a
turn's log copied to Redis), `redis_link.py` (the keys, the scripts, the client) and `counters.py`
(the per-user limits counted in Redis).
"""

from collections.abc import Callable, Collection
from typing import Any, Protocol

from pocketchat.cluster.local import LocalCoordinator
from pocketchat.cluster.replicas import Replicas
from pocketchat.conversations import Conversation, Hub, Turn, TurnIds
from pocketchat.limits import Limits, Taken
from pocketchat.records import ConversationRecord
from pocketchat.settings import Settings
from pocketchat.store import Store
from pocketchat.turn_log import TurnLog


class Coordinator(Protocol):
    """Everything the app asks of the coordinator: in one process every call is trivial; with
    replicas, each is where the others are told, asked, or waited for."""

    limits: Limits  # counted here, or in Redis across replicas
    replica: str  # this process's name, new at each start
    on_lag: Callable[[float], None] | None  # told how far behind the producer a read of its log was
    # Told of documents removed on another replica: (conversation id, document id, or None for all of a
    # deleted conversation's), so that their indexing here stops at once.
    on_documents_removed: Callable[[str, str | None], None] | None

    @property
    def failure(self) -> str | None:
        """Why Redis cannot be reached now (`/healthz` says so); always None in one process."""

    @property
    def stopped(self) -> str | None:
        """Which of its background work ended, if any did (`/healthz` fails then)."""

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    # ---- a turn ----------------------------------------------------------------------------------

    def new_log(self, turn_id: str) -> TurnLog:
        """The log a turn that runs here gets: in memory, or copied to Redis for the other replicas."""

    async def claim(self, conversation: Conversation, ids: TurnIds, user: str) -> Taken:
        """The user's limits and, with replicas, the conversation's lease: the one running turn."""

    async def release_claim(self, conversation: Conversation, taken: Taken) -> None:
        """The claimed turn could not begin: what `claim` took goes back."""

    async def started(self, conversation: Conversation, turn: Turn, lease: str) -> None: ...

    async def finished(self, conversation: Conversation, turn: Turn) -> None:
        """The turn's `turn_end` is in its log (with replicas: copy the rest, and let the lease go)."""

    def stop(self, turn: Turn) -> None:
        """Stop a turn, here or on the replica that runs it."""

    def stop_unseen(self, conversation: Conversation, turn_id: str) -> None:
        """Stop a turn this process has not heard of (it may run on another replica)."""

    # ---- a conversation --------------------------------------------------------------------------

    async def adopt(self, conversation: Conversation) -> None:
        """A conversation just loaded: follow its turn from here if it runs on another replica."""

    async def remember_new(self, record: ConversationRecord) -> None:
        """Keep a new conversation where other replicas find it (for UNSTORED_KEEP_SECONDS); returns
        once they can."""

    def refresh_new(self, record: ConversationRecord) -> None:
        """`remember_new` again, from now, not waited for."""

    async def find_new(self, conversation_id: str) -> ConversationRecord | None:
        """A new conversation (not stored yet) made on another replica."""

    def changed(self, conversation: Conversation, names: Collection[str]) -> None:
        """Fields of its record changed here: the other replicas' sockets are told."""

    def pressed(self, conversation_id: str, frame: dict[str, Any]) -> None:
        """A button of a reply was pressed here (`frame`, recorded): the other replicas keep it and tell their
        sockets."""

    def documents_changed(self, conversation_id: str, frame: dict[str, Any]) -> None:
        """A document of the conversation changed state here (`frame`): the other replicas' sockets are told."""

    async def hold_for_switch(self, conversation_id: str) -> str | None:
        """About to switch its path: no turn may start on it anywhere until `let_go` (TurnInProgress if one
        runs). What to give `let_go`."""

    async def let_go(self, conversation_id: str, held: str | None) -> None:
        """The switch's write landed, or was given up waiting for (then, should it be refused when it
        lands, it is not written again: pocketchat/paths.py): turns may start again."""

    def switched(self, conversation_id: str, leaf_id: str | None, version: int) -> None:
        """A path (`leaf_id`, at path `version`) was stored from here: the other replicas show it, unless
        they know a later version, and tell their sockets."""

    async def deleting(self, conversation_id: str) -> None:
        """About to delete it: no turn may start on it anywhere meanwhile."""

    def deleted(self, conversation_ids: list[str]) -> None:
        """They are deleted (one, or a failed import's many): the other replicas' sockets on them are
        told, and let go."""

    # ---- an import -------------------------------------------------------------------------------

    async def replica_gone(self, replica: str, quiet_for: float) -> bool:
        """Whether the process of that name has stopped (this one's before a restart, or a dead replica),
        its import having written nothing for `quiet_for` seconds: what it left unfinished is deleted."""


def make_coordinator(settings: Settings, hub: Hub, store: Store) -> Coordinator:
    """The coordinator the settings ask for: replicas linked through Redis with `--redis-url`, else
    one process."""
    if settings.redis_url is None:
        return LocalCoordinator(settings)
    return Replicas(settings, settings.redis_url.get_secret_value(), hub, store)
