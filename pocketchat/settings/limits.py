"""The settings of what one user may use: per-user limits (`pocketchat/limits.py` counts them), the sizes of
what can be uploaded, and the budgets of the jobs a user's input sets the cost of (`pocketchat/jobs/`)."""

from pydantic import BaseModel, Field


class LimitSettings(BaseModel):
    limit_running_turns: int = Field(3, ge=0, description="Replies one user may have streaming at once (0: no limit).")
    limit_messages_per_minute: int = Field(
        20, ge=0, description="Messages (and regenerates and edits) one user may send a minute (0: no limit)."
    )
    limit_sockets: int = Field(20, ge=0, description="WebSockets (tabs) one user may have open (0: no limit).")
    limit_conversations_per_minute: int = Field(
        30, ge=0, description="New conversations one user may start a minute (0: no limit)."
    )
    limit_hellos_per_minute: int = Field(
        300,
        ge=0,
        description="Hellos one user may send a minute: each opens a conversation on a socket, an existing "
        "one or a new one (0: no limit).",
    )
    limit_changes_per_minute: int = Field(
        120,
        ge=0,
        description="Renames, model or system prompt changes, deletes, switches between versions and share links"
        " made one user may make a minute (0: no limit).",
    )
    limit_searches_per_minute: int = Field(
        300,
        ge=0,
        description="Searches one user may make a minute (the search box asks as they type) (0: no limit).",
    )
    limit_tool_calls_per_minute: int = Field(
        60, ge=0, description="Tool calls the model may make a minute in one user's replies (0: no limit)."
    )
    limit_document_bytes: int = Field(
        20_000_000, gt=0, description="Largest file that can be attached to a conversation, in bytes."
    )
    limit_documents_per_conversation: int = Field(
        20, ge=0, description="Documents one conversation may have (0: no limit)."
    )
    limit_document_bytes_per_user: int = Field(
        200_000_000, ge=0, description="Bytes all of one user's documents may take together (0: no limit)."
    )
    limit_image_bytes: int = Field(10_000_000, gt=0, description="Largest image that can be attached, in bytes.")
    limit_images_per_message: int = Field(
        4, gt=0, description="Images one message may carry (and that may wait to go with the next one)."
    )
    limit_image_bytes_per_user: int = Field(
        1_000_000_000, ge=0, description="Bytes all of one user's images may take together (0: no limit)."
    )
    limit_import_bytes: int = Field(
        100_000_000,
        gt=0,
        description="Largest file that can be imported (ChatGPT's conversations.json, or ours), in bytes.",
    )


class JobSettings(BaseModel):
    job_workers: int = Field(
        4,
        gt=0,
        description="Worker processes for the work a user's input sets the cost of (reading a document, cutting it "
        "into passages, decoding an image, a calculation): started when first needed, at most this many.",
    )
    job_workers_per_user: int = Field(
        2,
        gt=0,
        description="Workers one user's jobs may hold at once; their others wait, and a free worker goes to the "
        "user served longest ago, so no one user takes every worker.",
    )
    job_seconds: float = Field(
        30.0,
        gt=0,
        description="Seconds a job may take (reading one document, decoding one image); then its worker is "
        "stopped and the user told the file took too long to read.",
    )
    job_memory_mb: int = Field(
        1000,
        gt=0,
        description="Megabytes of memory a job may take beyond its worker's own; then it is stopped and the user "
        "told the file needs too much memory to read.",
    )
