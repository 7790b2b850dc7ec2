"""The graph of a chat turn: stream the reply, then title the conversation if it has no title yet."""

from pocketflow import AsyncFlow

from nodes import StreamChat, TitleConversation


def create_chat_flow(retries: int = 3, retry_wait: float = 0.5) -> AsyncFlow:
    """One turn. `retries`/`wait` apply only until the first chunk is sent (see StreamChat.exec_async)."""
    chat = StreamChat(max_retries=retries, wait=retry_wait)
    title = TitleConversation()
    chat >> title
    return AsyncFlow(start=chat)
