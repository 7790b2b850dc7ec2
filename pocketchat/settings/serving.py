"""The settings of how the app serves: where it listens, which names and origins it answers, and how it
treats sockets and logs; and the host and origin spellings they are compared in."""

import ipaddress
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator

from pocketchat.settings.common import CommaList

LogLevel = Literal["CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG"]  # the names both logging and uvicorn know
DEFAULT_PORTS = {"http": 80, "https": 443}


class ServingSettings(BaseModel):
    host: str = Field("127.0.0.1", description="Address to bind, IPv4 or IPv6; 0.0.0.0 or :: for every interface.")
    port: int = Field(8000, description="Port to listen on.")
    allowed_origins: CommaList = Field(
        default_factory=list,
        description="Extra browser origins allowed to open the WebSocket, comma-separated "
        "(the page's own origin is always allowed; 'null', the opaque origin any site can make, only if listed).",
    )
    allowed_hosts: CommaList = Field(
        default_factory=list,
        description="Host names the server answers to, comma-separated; unset means the loopback names plus "
        "--host. Required with --auth token or header beyond loopback. Guards against DNS rebinding.",
    )
    max_frame_bytes: int = Field(262_144, gt=0, description="Largest client frame accepted.")
    send_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds a WebSocket may take to accept one frame; a socket slower than that is closed with "
        "code 1013 and its page reconnects and resumes.",
    )
    log_level: LogLevel = Field("INFO", description="Logging level: DEBUG, INFO, WARNING, ERROR or CRITICAL.")

    @field_validator("allowed_origins", mode="before")
    @classmethod
    def _opaque_origin(cls, value: object) -> object:
        # The flag parser reads a bare `--allowed-origins null` as JSON's null: it means the origin "null".
        return ["null"] if value is None else value

    @field_validator("allowed_origins")
    @classmethod
    def _normalize_origins(cls, origins: list[str]) -> list[str]:
        return [normalize_origin(origin) for origin in origins]

    @field_validator("allowed_hosts")
    @classmethod
    def _normalize_hosts(cls, hosts: list[str]) -> list[str]:
        return [host_pattern(host) for host in hosts]

    @field_validator("host")
    @classmethod
    def _unbracket_host(cls, host: str) -> str:
        # The server binds to the bare address; "[::1]" is how a URL writes it.
        address = _ipv6(host)
        return address.compressed if address else host

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_case_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @property
    def trusted_hosts(self) -> list[str]:
        """The hosts of the Host headers to answer, in the form starlette's TrustedHostMiddleware compares
        (IPv6 literals in brackets): a page on another site that resolves its name to us gets nothing."""
        if self.allowed_hosts:
            return self.allowed_hosts
        if self.host == "0.0.0.0" or ((address := _ipv6(self.host)) and address.is_unspecified):
            return ["*"]
        return sorted({"127.0.0.1", "localhost", "[::1]", host_pattern(self.host)})

    @property
    def on_loopback(self) -> bool:
        """Whether only this machine can reach the app."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False  # a host name: it may resolve to any address


def _ipv6(text: str) -> ipaddress.IPv6Address | None:
    """`text` as an IPv6 address, with or without the brackets a URL puts around one."""
    try:
        return ipaddress.IPv6Address(text.removeprefix("[").removesuffix("]"))
    except ValueError:
        return None


def host_pattern(host: str) -> str:
    """A host name as the Host header carries it, less its port: lower case, IPv6 literals in brackets."""
    host = host.strip().lower()
    if address := _ipv6(host):
        return f"[{address.compressed}]"
    if ":" in host:
        raise ValueError(f"allowed host {host!r} must be a host name without a port")
    # starlette's TrustedHostMiddleware would fail an assertion at start-up on any other wildcard.
    if host != "*" and "*" in host.removeprefix("*."):
        raise ValueError(f"allowed host {host!r}: a wildcard must be '*' or like '*.example.com'")
    return host


def normalize_origin(origin: str) -> str:
    """`origin` as a browser's Origin header spells it: scheme://host[:port], lower case, no default port.

    Browsers send the compressed form of an IPv6 literal and never a path, so a configured origin that
    differs only in case, a trailing slash or a default port still matches. `null` (the opaque origin
    of sandboxed iframes, data: URLs and files) is kept as it is: allowed only when listed."""
    if origin.strip().lower() == "null":
        return "null"
    parts = urlsplit(origin.strip())
    extra = parts.username is not None or parts.path not in ("", "/") or parts.query or parts.fragment
    if not parts.scheme or not parts.hostname or extra:
        raise ValueError(f"allowed origin {origin!r} must be scheme://host or scheme://host:port")
    scheme = parts.scheme.lower()
    host = host_pattern(parts.hostname)
    port = parts.port
    return f"{scheme}://{host}" if port in (None, DEFAULT_PORTS.get(scheme)) else f"{scheme}://{host}:{port}"
