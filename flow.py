"""The graph of a chat turn: name the conversation if it has no title yet, then stream the reply."""

from pocketflow import AsyncFlow

from nodes import StreamChat, TitleConversation


def create_chat_flow(retries: int = 3, retry_wait: float = 0.5) -> AsyncFlow:
    """One turn. `retries`/`wait` apply only until the first chunk is sent (see StreamChat.exec_async)."""
    title = TitleConversation()
    chat = StreamChat(max_retries=retries, wait=retry_wait)
    title >> chat
    return AsyncFlow(start=title)
