"""Conversations in and out as files: the JSON export (the whole tree of messages), the import of our
own files and of ChatGPT's `conversations.json`, run in the background with its progress."""
