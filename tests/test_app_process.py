"""The test harness's own app starter: a port taken between choosing it and binding it."""

import socket
from pathlib import Path

import pytest

from tests.conftest import API_KEY, NO_LIMITS, AppProcess
from tests.fake_openai import FakeOpenAI
from tests.services import free_port


def test_an_app_whose_port_was_taken_meanwhile_starts_on_another(tmp_path: Path, fake: FakeOpenAI) -> None:
    app = AppProcess(
        tmp_path, ["--base-url", f"http://127.0.0.1:{fake.port}/v1", *NO_LIMITS], {"POCKETCHAT_API_KEY": API_KEY}
    )
    taken = app.port
    # What another process's connection or server can do between free_port() and the app's bind.
    with socket.create_server(("127.0.0.1", taken)):
        try:
            app.start()
            assert app.port != taken
            assert app.client().hello()["type"] == "ready"
        finally:
            app.kill()


PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@pytest.mark.skipif(not PORT_RANGE.exists(), reason="Linux says its ephemeral port range there")
def test_free_ports_are_outside_the_range_outgoing_connections_draw_from() -> None:
    low, high = (int(part) for part in PORT_RANGE.read_text().split())
    assert all(not low <= free_port() <= high for _ in range(50))
