"""Who may configure the app: POCKETCHAT_<NAME>, the documented OPENAI_ variables and the flags, nobody else."""

import logging
import os

import pytest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from pocketchat.settings import Settings, normalize_origin
from tests.conftest import API_KEY, AppProcess
from tests.fake_openai import FakeOpenAIThread

# Two valid values of each setting, neither of them its default: the second one tells which source won.
SAMPLES: dict[str, tuple[str, str]] = {
    "provider": ("openai", "local"),
    "base_url": ("http://one.invalid/v1", "http://two.invalid/v1"),
    "api_key": ("sk-one-0123456789", "sk-two-0123456789"),
    "model": ("model-one", "model-two"),
    "model_path": ("/tmp/one.gguf", "/tmp/two.gguf"),
    "flow": ("flow-one", "flow-two"),
    "flows": ("chat", "chat,research"),
    "system_prompt": ("Prompt one.", "Prompt two."),
    "db_path": ("one.db", "two.db"),
    "host": ("192.0.2.1", "192.0.2.2"),
    "port": ("8101", "8102"),
    "allowed_origins": ("https://one.example", "https://two.example"),
    "allowed_hosts": ("one.example", "two.example"),
    "context_budget": ("1001", "1002"),
    "max_tokens": ("101", "102"),
    "temperature": ("0.25", "0.5"),
    "idle_limit": ("11", "12"),
    "retries": ("5", "6"),
    "retry_wait": ("0.75", "1.5"),
    "max_frame_bytes": ("4096", "8192"),
    "log_level": ("DEBUG", "ERROR"),
    "send_timeout": ("2.5", "3.5"),
    "auth": ("token", "header"),
    "insecure_no_auth": ("true", "false"),  # a switch: its one other value, and back
    "token": ("token-one-0123456789", "token-two-0123456789"),
    "auth_header": ("X-User-One", "X-User-Two"),
    "trusted_proxies": ("10.0.0.0/8", "192.0.2.7"),
    "session_days": ("7", "14"),
    "limit_running_turns": ("5", "6"),
    "limit_messages_per_minute": ("50", "60"),
    "limit_sockets": ("7", "8"),
    "limit_conversations_per_minute": ("9", "10"),
    "limit_hellos_per_minute": ("11", "12"),
    "limit_changes_per_minute": ("13", "14"),
    "limit_searches_per_minute": ("17", "18"),
    "database_url": ("postgresql://one.invalid/db", "postgresql://two.invalid/db"),
    "redis_url": ("redis://one.invalid:6379/0", "redis://two.invalid:6379/0"),
    "drain_timeout": ("5", "6"),
    "redis_prefix": ("one:", "two:"),
    "embedding_model": ("embed-one", "embed-two"),
    "limit_document_bytes": ("1000001", "1000002"),
    "limit_documents_per_conversation": ("15", "16"),
    "limit_document_bytes_per_user": ("3000001", "3000002"),
    "vision_models": ("model-one-*", "model-two-*,*-vl"),
    "limit_image_bytes": ("1000003", "1000004"),
    "limit_images_per_message": ("7", "8"),
    "limit_image_bytes_per_user": ("3000003", "3000004"),
    "limit_import_bytes": ("4000003", "4000004"),
    "job_workers": ("5", "6"),
    "job_workers_per_user": ("3", "4"),
    "job_seconds": ("11", "12"),
    "job_memory_mb": ("500", "600"),
    "mcp_config": ("/tmp/one.json", "/tmp/two.json"),
    "max_tool_steps": ("3", "4"),
    "max_tools": ("100", "101"),
    "tool_timeout": ("5", "6"),
    "tool_result_chars": ("1001", "1002"),
    "limit_tool_calls_per_minute": ("17", "18"),
}
SETTINGS = list(Settings.model_fields)
DOCUMENTED_OPENAI = {"base_url": "OPENAI_BASE_URL", "api_key": "OPENAI_API_KEY"}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def is_switch(name: str) -> bool:
    return Settings.model_fields[name].annotation is bool


def flag_args(name: str, raw: str) -> list[str]:
    """The flags that set `name` to `raw`: a switch takes no value (--x, or --no-x)."""
    if is_switch(name):
        return [flag(name) if raw == "true" else "--no-" + flag(name)[2:]]
    return [flag(name), raw]


def load(*args: str) -> Settings:
    """The settings `python main.py *args` would run with."""
    return Settings(_cli_parse_args=list(args))  # type: ignore[call-arg]


def expected(name: str, raw: str) -> object:
    """What `raw` means for setting `name`, parsed the way every source parses it."""
    return getattr(Settings(**{name: raw}), name)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """No variable of the machine running the tests may leak into them."""
    prefixes = ("POCKETCHAT_", "OPENAI_")
    bare = {name.upper() for name in SETTINGS}
    for variable in list(os.environ):
        if variable.upper().startswith(prefixes) or variable.upper() in bare:
            monkeypatch.delenv(variable)


def test_every_setting_has_samples():
    assert set(SAMPLES) == set(SETTINGS)
    for name, (one, two) in SAMPLES.items():
        default = Settings.model_fields[name].get_default(call_default_factory=True)
        assert expected(name, one) != expected(name, two)
        assert default != expected(name, one)
        assert is_switch(name) or default != expected(name, two)


@pytest.mark.parametrize("name", SETTINGS)
def test_a_bare_or_foreign_variable_configures_nothing(monkeypatch, name):
    defaults = load()
    value = SAMPLES.get(name, ("trap", "trap"))[0]
    traps = [name.upper(), name, f"OPENAI_{name.upper()}", f"openai_{name}"]
    for variable in traps:
        if variable == DOCUMENTED_OPENAI.get(name):
            continue
        monkeypatch.setenv(variable, value)
        assert load() == defaults, f"{variable} configured the app"
        monkeypatch.delenv(variable)


@pytest.mark.parametrize("name", SETTINGS)
def test_the_prefixed_variable_sets_it_and_the_flag_wins(monkeypatch, name):
    one, two = SAMPLES[name]
    monkeypatch.setenv(f"POCKETCHAT_{name.upper()}", one)
    assert getattr(load(), name) == expected(name, one)
    assert getattr(load(*flag_args(name, two)), name) == expected(name, two)


@pytest.mark.parametrize("name", SETTINGS)
def test_the_flag_sets_it(name):
    assert getattr(load(*flag_args(name, SAMPLES[name][0])), name) == expected(name, SAMPLES[name][0])


@pytest.mark.parametrize("name", DOCUMENTED_OPENAI)
def test_the_documented_openai_variable_sets_it_below_the_prefixed_one_and_the_flag(monkeypatch, name):
    one, two = SAMPLES[name]
    monkeypatch.setenv(DOCUMENTED_OPENAI[name], one)
    assert getattr(load(), name) == expected(name, one)
    monkeypatch.setenv(f"POCKETCHAT_{name.upper()}", two)
    assert getattr(load(), name) == expected(name, two)
    monkeypatch.delenv(f"POCKETCHAT_{name.upper()}")
    assert getattr(load(flag(name), two), name) == expected(name, two)


def test_no_undocumented_flag_names_a_setting(capsys):
    with pytest.raises(SystemExit):
        load("--help")
    help_text = capsys.readouterr().out
    assert "--openai-" not in help_text and "--pocketchat-" not in help_text


def test_a_stray_base_url_never_receives_the_key(tmp_path, fake):
    """End to end: OPENAI_API_KEY and OPENAI_BASE_URL set, and BASE_URL (meant for some other program) pointing
    at a second server, which must get nothing: before the fix, it got every request with the key."""
    with FakeOpenAIThread() as stray:
        env = {
            "OPENAI_API_KEY": API_KEY,
            "OPENAI_BASE_URL": f"http://127.0.0.1:{fake.port}/v1",
            "BASE_URL": f"http://127.0.0.1:{stray.port}/v1",
            "base_url": f"http://127.0.0.1:{stray.port}/v1",
            "MODEL": "fake-model-large",
        }
        app = AppProcess(tmp_path, ["--retries", "1"], env).start()
        try:
            client = app.client()
            assert client.hello()["model"] == "fake-model"  # the first listed, not MODEL's
            assert client.turn("hi")[-1]["status"] == "complete"
        finally:
            app.kill()
        assert stray.requests == []
    assert fake.chat_requests and all(r["headers"]["authorization"] == f"Bearer {API_KEY}" for r in fake.requests)


@pytest.mark.parametrize("level", ["debug", "Info", "WARNING", "error", "critical"])
def test_the_log_level_is_a_standard_name_in_any_case(level):
    settings = load("--log-level", level)
    assert settings.log_level == level.upper()
    assert logging.getLevelName(settings.log_level) == getattr(logging, level.upper())


@pytest.mark.parametrize("level", ["verbose", "warn", "10", ""])
def test_an_unknown_log_level_is_refused_with_the_names_it_may_be(level):
    with pytest.raises(ValidationError) as error:
        load("--log-level", level)
    assert "log_level" in str(error.value) and "'DEBUG'" in str(error.value) and "'CRITICAL'" in str(error.value)


@pytest.mark.parametrize(
    ("given", "normalized"),
    [
        ("https://Chat.Example.COM/", "https://chat.example.com"),
        ("HTTP://chat.example.com:8080", "http://chat.example.com:8080"),
        ("https://chat.example.com:443", "https://chat.example.com"),
        ("http://chat.example.com:80/", "http://chat.example.com"),
        ("http://[0:0::1]:8000", "http://[::1]:8000"),
        ("http://[::FFFF:7F00:1]", "http://[::ffff:7f00:1]"),
    ],
)
def test_allowed_origins_are_normalized_as_browsers_send_them(given, normalized):
    assert load("--allowed-origins", f"{given}, https://other.example").allowed_origins == [
        normalized,
        "https://other.example",
    ]
    assert normalize_origin(given) == normalized


@pytest.mark.parametrize(
    "given",
    ["chat.example.com", "https://chat.example.com/app", "https://", "file:///index.html", "https://me@chat.example"],
)
def test_an_allowed_origin_that_no_browser_sends_is_refused(given):
    with pytest.raises(ValidationError, match="scheme://host"):
        load("--allowed-origins", given)


@pytest.mark.parametrize("given", ["null", "NULL", " Null "])
def test_the_opaque_origin_null_is_allowed_only_when_listed(given, monkeypatch):
    assert load().allowed_origins == []
    assert load("--allowed-origins", given).allowed_origins == ["null"]
    assert load("--allowed-origins", f"{given},https://a.example").allowed_origins == ["null", "https://a.example"]
    monkeypatch.setenv("POCKETCHAT_ALLOWED_ORIGINS", given)
    assert load().allowed_origins == ["null"]


def host_status(trusted: list[str], host_header: str) -> int:
    """The status starlette's TrustedHostMiddleware (as the app installs it) gives a request with this Host."""
    app = Starlette(
        routes=[Route("/", lambda request: PlainTextResponse("ok"))],
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=trusted)],
    )
    with TestClient(app) as client:
        return client.get("/", headers={"host": host_header}).status_code


@pytest.mark.parametrize("host", ["::1", "[::1]", "0:0:0:0:0:0:0:1"])
def test_an_ipv6_host_is_trusted_in_brackets(host):
    trusted = load("--host", host).trusted_hosts
    assert "[::1]" in trusted and "::1" not in trusted
    assert host_status(trusted, "[::1]:8000") == 200
    assert host_status(trusted, "[::1]") == 200
    assert host_status(trusted, "localhost:8000") == 200
    assert host_status(trusted, "evil.example:8000") == 400


def test_an_ipv6_literal_in_allowed_hosts_is_trusted_in_brackets():
    trusted = load("--allowed-hosts", "Chat.Example, fd00::2, [FD00::3]").trusted_hosts
    assert trusted == ["chat.example", "[fd00::2]", "[fd00::3]"]
    assert host_status(trusted, "[fd00::2]:8000") == 200
    assert host_status(trusted, "CHAT.example") == 200


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "0:0::0"])
def test_every_host_is_trusted_when_bound_to_every_interface(host):
    assert load("--host", host).trusted_hosts == ["*"]


def test_an_allowed_host_with_a_port_is_refused():
    with pytest.raises(ValidationError, match="without a port"):
        load("--allowed-hosts", "chat.example:8000")


@pytest.mark.parametrize("pattern", ["*", "*.Example.com"])
def test_a_wildcard_host_is_kept(pattern):
    assert load("--allowed-hosts", pattern).trusted_hosts == [pattern.lower()]


@pytest.mark.parametrize("pattern", ["chat.*.com", "*example.com", "**.example.com"])
def test_a_wildcard_starlette_cannot_match_is_refused(pattern):
    with pytest.raises(ValidationError, match="wildcard"):
        load("--allowed-hosts", pattern)


class IPv6AppProcess(AppProcess):
    @property
    def url(self) -> str:
        return f"http://[::1]:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://[::1]:{self.port}/ws"


def test_the_app_bound_to_ipv6_loopback_answers_there(tmp_path, fake):
    app = IPv6AppProcess(tmp_path, ["--host", "::1", "--base-url", f"http://127.0.0.1:{fake.port}/v1"]).start()
    try:
        assert app.get("/healthz") is not None
        assert app.client().hello()["model"] == "fake-model"
    finally:
        app.kill()


def test_send_timeout_defaults_to_ten_seconds_and_must_be_positive():
    assert load().send_timeout == 10.0
    with pytest.raises(ValidationError):
        load("--send-timeout", "0")
