"""The settings of where conversations live: one SQLite file, or PostgreSQL and Redis shared by replicas."""

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr


class StorageSettings(BaseModel):
    db_path: Path = Field(Path("pocketchat.db"), description="SQLite database file (when no --database-url).")
    database_url: SecretStr | None = Field(
        None,
        description="A postgresql:// URL: conversations, messages, sessions and the app's secret live in "
        "PostgreSQL, shared by every replica. Unset: the SQLite file --db-path. Never logged.",
    )
    redis_url: SecretStr | None = Field(
        None,
        description="A redis:// URL: turn logs and events between replicas go through Redis, so that any "
        "replica serves any conversation. Needs --database-url. Unset: one process. Never logged.",
    )
    redis_prefix: str = Field(
        "pocketchat:",
        min_length=1,
        description="Prefix of every Redis key, so that several deployments (or test runs) share one Redis.",
    )
    drain_timeout: float = Field(
        30.0,
        ge=0,
        description="On SIGTERM, seconds the running replies may take to finish before they are stopped and stored.",
    )

    @property
    def clustered(self) -> bool:
        """Whether other replicas may share the database and the turn logs."""
        return self.redis_url is not None
