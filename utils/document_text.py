"""Read one of a conversation's documents whole, for the model's document tool: its passages in order,
as stored when it was indexed (only a ready document of the conversation's owner is read)."""

from typing import Protocol

from pocketchat.records import DocumentRecord, Passage


class DocumentStore(Protocol):
    async def list_documents(self, conversation_id: str, owner: str) -> list[DocumentRecord]: ...

    async def document_vectors(self, document_id: str) -> tuple[list[int], list[bytes]]: ...

    async def passages(self, owner: str, ids: list[int]) -> list[Passage]: ...


class NoSuchDocument(LookupError):
    """The conversation has no ready document by that name; says which it has."""


async def read_conversation_document(store: DocumentStore, conversation_id: str, owner: str, name: str) -> str:
    """The text of the conversation's ready document called `name` (or whose id it is), page by page;
    names are compared without regard to case when no name matches exactly."""
    ready = [d for d in await store.list_documents(conversation_id, owner) if d.status == "ready"]
    document = next((d for d in ready if name in (d.name, d.id)), None) or next(
        (d for d in ready if d.name.casefold() == name.strip().casefold()), None
    )
    if document is None:
        names = ", ".join(repr(d.name) for d in ready) or "none"
        raise NoSuchDocument(f"This conversation has no ready document called {name!r:.100}. It has: {names}.")
    ids, _ = await store.document_vectors(document.id)
    passages = sorted(await store.passages(owner, ids), key=lambda passage: passage.seq)
    parts, page = [], None
    for passage in passages:
        if passage.page is not None and passage.page != page:
            page = passage.page
            parts.append(f"[page {page}]")
        parts.append(passage.text)
    return f"{document.name}\n\n" + "\n\n".join(parts)
