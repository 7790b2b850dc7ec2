"""The settings of who may use the app: the sign-in mode, its token, the proxies believed, and how long a
sign-in lasts."""

import ipaddress
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator

from pocketchat.settings.common import CommaList


class AccessSettings(BaseModel):
    auth: Literal["none", "token", "header"] | None = Field(
        None,
        description="Who may use the app: 'none' (anyone who reaches it; loopback only), 'token' (one access "
        "token, then a session cookie) or 'header' (the user an authenticating proxy names). Unset: 'none' "
        "on a loopback address, 'token' on any other.",
    )
    insecure_no_auth: bool = Field(
        False,
        description="Allow --auth none on an address beyond loopback: anyone who reaches the app reads and "
        "deletes every conversation.",
    )
    token: SecretStr | None = Field(
        None,
        min_length=16,
        description="The access token of --auth token (16 characters at least); unset: one is made on first "
        "start (192 random bits) and kept in the database.",
    )
    auth_header: str = Field(
        "X-Forwarded-User",
        min_length=1,
        description="With --auth header: the request header that names the user, set by the proxy.",
    )
    trusted_proxies: CommaList = Field(
        default_factory=lambda: ["127.0.0.1", "::1"],
        description="Addresses or networks (10.0.0.0/8) of the proxies in front of the app, comma-separated: "
        "only from them are --auth-header and X-Forwarded-For/-Proto believed.",
    )
    session_days: float = Field(30.0, gt=0, description="Days a sign-in lasts.")

    @field_validator("trusted_proxies")
    @classmethod
    def _parse_networks(cls, proxies: list[str]) -> list[str]:
        return [str(ipaddress.ip_network(proxy, strict=False)) for proxy in proxies]
