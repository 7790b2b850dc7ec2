"""A conversation's messages as a tree: each names its parent (the message before it on its path), so a
reply answered again or an edited message is a new version beside the earlier ones, which stay. The
conversation shows one path, from its first message to a leaf; `ready.history`, the prompt and the
export follow it."""

from collections.abc import Iterable, Iterator

from pocketchat.records import Message


class Tree:
    """Every message of a conversation, every version of each, in the order they were written."""

    def __init__(self, messages: Iterable[Message] = ()) -> None:
        self._order: dict[str, int] = {}  # by id: its place in the order written (later: newer)
        self._by_id: dict[str, Message] = {}
        self._children: dict[str | None, list[Message]] = {}  # by parent id (None: first messages)
        self._written = 0
        self.changes = 0  # counts every change: what was computed from the tree before is stale after
        for message in messages:
            self.add(message)

    def __iter__(self) -> Iterator[Message]:
        return iter(self._by_id.values())

    def get(self, message_id: str | None) -> Message | None:
        return self._by_id.get(message_id) if message_id is not None else None

    def add(self, message: Message) -> None:
        """Add a message (one already here is left as it is)."""
        if message.id in self._by_id:
            return
        self._by_id[message.id] = message
        self._order[message.id] = self._written
        self._written += 1
        self._children.setdefault(message.parent_id, []).append(message)
        self.changes += 1

    def drop(self, ids: set[str]) -> None:
        """Forget these messages (a turn's rows read from the database while another replica wrote it)."""
        for message_id in ids & self._by_id.keys():
            message = self._by_id.pop(message_id)
            del self._order[message_id]
            self._children[message.parent_id].remove(message)
        self.changes += 1

    def versions(self, message: Message) -> list[str]:
        """The ids of every version of the message (those with its parent), oldest first, its own among them."""
        return [sibling.id for sibling in self._children.get(message.parent_id, [])]

    def path(self, leaf_id: str | None) -> list[Message]:
        """The messages from the first to `leaf_id`; to the newest message when it is None or unknown."""
        leaf = self._by_id.get(leaf_id) if leaf_id is not None else None
        if leaf is None and self._by_id:
            leaf = max(self._by_id.values(), key=lambda message: self._order[message.id])
        path: list[Message] = []
        seen: set[str] = set()
        while leaf is not None and leaf.id not in seen:  # `seen`: a cycle (an imported file's) ends the walk
            seen.add(leaf.id)
            path.append(leaf)
            leaf = self._by_id.get(leaf.parent_id) if leaf.parent_id is not None else None
        return path[::-1]

    def newest_under(self, message: Message) -> Message:
        """The newest message of the branch that starts at `message` (itself if nothing follows it): a
        leaf, since whatever follows a message was written after it."""
        newest, stack, seen = message, [message], {message.id}
        while stack:
            for child in self._children.get(stack.pop().id, []):
                if child.id in seen:
                    continue  # a cycle (an imported file's)
                seen.add(child.id)
                stack.append(child)
                if self._order[child.id] > self._order[newest.id]:
                    newest = child
        return newest
