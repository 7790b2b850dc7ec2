"""Replicas behind a real nginx, set up as deploy/ says: deploy/replica.env for every replica,
deploy/nginx.conf for the balancer, with the test's own ports, database and Redis prefix."""

import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.conftest import ROOT, AppProcess
from tests.services import free_port

DEPLOY = ROOT / "deploy"
TOKEN = "a-token-for-the-replicas-0123456789"


def replica_env(overrides: dict[str, str]) -> dict[str, str]:
    """deploy/replica.env, with the test's own values where it names them."""
    settings = {}
    for line in (DEPLOY / "replica.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            settings[name] = value
    return {**settings, **overrides}


class Nginx:
    """deploy/nginx.conf, run by Debian's nginx in a directory of the test's own."""

    def __init__(self, directory: Path, upstreams: list[int]) -> None:
        self.directory = directory
        self.port = free_port()
        config = (DEPLOY / "nginx.conf").read_text()
        # The replicas' lines, with the parameters deploy/nginx.conf gives them (max_fails...).
        lines = re.search(r"(        server 127\.0\.0\.1:\d+([^;\n]*);\n)+", config)
        assert lines is not None, "deploy/nginx.conf lists no replica"
        servers = "".join(f"        server 127.0.0.1:{port}{lines.group(2)};\n" for port in upstreams)
        config = config[: lines.start()] + servers + config[lines.end() :]
        config = config.replace("listen 127.0.0.1:8000;", f"listen 127.0.0.1:{self.port};")
        (directory / "tmp").mkdir(parents=True, exist_ok=True)
        (directory / "nginx.conf").write_text(config)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    def start(self) -> "Nginx":
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        command = [binary, "-p", str(self.directory), "-c", "nginx.conf", "-g", "daemon off; user root;"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while True:
            try:
                urllib.request.urlopen(self.url + "/livez", timeout=1).close()
                return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"nginx did not start: {self.errors()}") from None
                time.sleep(0.05)

    def errors(self) -> str:
        log = self.directory / "error.log"
        return log.read_text() if log.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


def start_replica(tmp: Path, fake_port: int, shared: dict[str, str], *args: str) -> AppProcess:
    env = replica_env({**shared, "POCKETCHAT_API_KEY": "sk-test-replicas-0123456789"})
    flags = ["--base-url", f"http://127.0.0.1:{fake_port}/v1", "--retry-wait", "0.05", *args]
    return AppProcess(tmp, flags, env).start()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def post(url: str, cookie: str = "", data: bytes = b"") -> urllib.error.HTTPError:
    """A POST whose answer is a redirect (sign-in, sign-out): the answer, not where it points."""
    request = urllib.request.Request(url, data=data, method="POST", headers={"Cookie": cookie} if cookie else {})
    with pytest.raises(urllib.error.HTTPError) as redirected:
        urllib.request.build_opener(NoRedirect).open(request, timeout=10)
    redirected.value.close()
    assert redirected.value.code == 303
    return redirected.value


def sign_in(url: str) -> str:
    """The session cookie a browser gets for the token (signed in on whichever replica answers)."""
    return post(url + "/login", data=urlencode({"token": TOKEN}).encode()).headers["set-cookie"].split(";")[0]
