"""Every setting of the app, in one table: environment variables and `python main.py` flags.

Only three sources configure the app, highest first: the flags, the POCKETCHAT_<NAME> variables, and
OPENAI_BASE_URL / OPENAI_API_KEY, the two variables every OpenAI client shares. A bare BASE_URL, API_KEY
or PORT that some other program set configures nothing: the key must not follow a stray BASE_URL.

`Settings` is one class with every field; its fields are declared by area, one module each (the model,
the storage, serving, access, limits and jobs, tools), so that a person who owns an area finds its
settings, their checks and their help together. docs/configuration.md documents each (tests/test_docs.py).
"""

import os
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from pocketchat.settings.access import AccessSettings
from pocketchat.settings.limits import JobSettings, LimitSettings
from pocketchat.settings.model import VISION_MODELS, ModelSettings
from pocketchat.settings.serving import ServingSettings, host_pattern, normalize_origin
from pocketchat.settings.storage import StorageSettings
from pocketchat.settings.tools import ToolSettings

__all__ = ["VISION_MODELS", "Settings", "host_pattern", "normalize_origin"]


class OpenAIVariables(PydanticBaseSettingsSource):
    """OPENAI_BASE_URL and OPENAI_API_KEY, spelt exactly so (as the OpenAI SDK reads them)."""

    VARIABLES: ClassVar[dict[str, str]] = {"base_url": "OPENAI_BASE_URL", "api_key": "OPENAI_API_KEY"}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        variable = self.VARIABLES.get(field_name)
        return (os.environ.get(variable) if variable else None), field_name, False

    def __call__(self) -> dict[str, Any]:
        found = (self.get_field_value(field, name) for name, field in self.settings_cls.model_fields.items())
        return {name: value for value, name, _ in found if value is not None}


# The areas are listed last first: pydantic orders the fields (and --help) from the last base to the first.
class Settings(
    ToolSettings,
    JobSettings,
    LimitSettings,
    AccessSettings,
    ServingSettings,
    StorageSettings,
    ModelSettings,
    BaseSettings,
):
    model_config = SettingsConfigDict(
        env_prefix="POCKETCHAT_",
        cli_kebab_case=True,
        cli_prog_name="python main.py",
        cli_implicit_flags=True,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The flags come first without being listed: pydantic-settings puts its CLI source ahead of these.
        # No .env file and no secrets directory: nothing configures the app unseen.
        return init_settings, env_settings, OpenAIVariables(settings_cls)

    @property
    def auth_mode(self) -> Literal["none", "token", "header"]:
        """The sign-in in force, once the default for the bind address is decided."""
        return self.auth or ("none" if self.on_loopback else "token")

    def startup_problem(self) -> str | None:
        """Why these settings must not serve, if they must not."""
        if self.redis_url is not None and self.database_url is None:
            return (
                "--redis-url needs --database-url: replicas that share Redis but each keep their own SQLite "
                "file would tell different stories. Set POCKETCHAT_DATABASE_URL=postgresql://..."
            )
        if self.database_url is not None and urlsplit(self.database_url.get_secret_value()).scheme not in (
            "postgresql",
            "postgres",
        ):
            return "--database-url must be a postgresql:// URL."
        if self.redis_url is not None and urlsplit(self.redis_url.get_secret_value()).scheme not in ("redis", "rediss"):
            return "--redis-url must be a redis:// or rediss:// URL."
        if self.auth_mode == "none" and not self.on_loopback and not self.insecure_no_auth:
            return (
                f"Refusing to serve {self.host} without a sign-in: anyone who reaches it could read every "
                "conversation. Use --auth token (or POCKETCHAT_AUTH=token), or --auth header behind an "
                "authenticating proxy; --insecure-no-auth overrides this."
            )
        if self.auth_mode != "none" and not self.on_loopback and not self.allowed_hosts:
            # Beyond loopback, any name can resolve to this address: a page of another site that points
            # its own name at it (DNS rebinding) would be same-origin with the app, and in header mode
            # nothing but the Host header would tell its requests apart.
            return (
                f"Refusing to serve {self.host} with --auth {self.auth_mode} and no --allowed-hosts: a page of "
                "any site could reach it under a name of its own (DNS rebinding). Name the hosts browsers use "
                "to reach it, e.g. --allowed-hosts chat.example.org,192.168.1.20 (or POCKETCHAT_ALLOWED_HOSTS)."
            )
        return None
