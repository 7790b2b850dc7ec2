"""What anyone may ask without signing in says no more than it must: /healthz says which part fails
and not why (the log does), /vendor serves the files the page loads and nothing else of node_modules."""

import json
import re
import urllib.error
import urllib.request

import pytest

from main import HERE
from pocketchat.web.assets import vendor_files
from tests.conftest import AppProcess
from tests.test_protocol import wait_for

TOKEN = "a-token-for-the-public-tests-0123"


def get(app: AppProcess, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(app.url + path, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as answer:
        with answer:
            return answer.code, answer.read()


@pytest.mark.parametrize("mode", ["replicas"], indirect=True)
def test_a_failing_part_is_named_in_healthz_and_its_reason_only_in_the_log(start_app, private_redis):
    app = start_app("--auth", "token", "--token", TOKEN, "--redis-url", private_redis.url)
    assert get(app, "/healthz") == (200, b'{"status":"ok","store":"ok","redis":"ok"}')
    private_redis.stop()

    def failing() -> bool:
        return get(app, "/healthz")[0] == 503

    wait_for(failing, timeout=20)
    status, body = get(app, "/healthz")
    assert status == 503 and json.loads(body) == {"status": "failing", "store": "ok", "redis": "failing"}
    private_redis.start()
    wait_for(lambda: get(app, "/healthz")[0] == 200, timeout=20)
    app.stop()
    assert re.search(rf"lost Redis: .*{private_redis.port}", app.logs())  # the operator still learns why


def test_healthz_says_no_more_than_ok_per_part(start_app):
    app = start_app("--auth", "token", "--token", TOKEN)
    assert json.loads(get(app, "/healthz")[1]) == {"status": "ok", "store": "ok"}


def test_vendor_serves_the_files_the_page_loads_and_nothing_else(start_app):
    app = start_app("--auth", "token", "--token", TOKEN)  # not signed in: /vendor is public
    page = (HERE / "pocketchat" / "web" / "templates" / "index.html").read_text()
    scripts = " ".join(path.read_text() for path in (HERE / "static").glob("*.js"))
    named = set(re.findall(r"/vendor/([^\"' )]+)", page + scripts))
    # Each names the version package.json pins and npm installed: vendor_files() keeps those alone.
    assert named and named <= set(vendor_files())
    for path in named:
        assert get(app, f"/vendor/{path}")[0] == 200, path
    refused = [
        "marked@18.2.0/lib/marked.esm.js",  # not the version installed
        "marked/lib/marked.esm.js",  # no version
        "marked@18.2.1/package.json",
        "marked/package.json",
        "dompurify/package.json",
        "@highlightjs/cdn-assets/package.json",
        "marked/README.md",
        "marked/lib/marked.esm.js.map",
        "marked/lib/marked.umd.js",
        "marked/bin/main.js",
        ".package-lock.json",
        "marked/lib/../package.json",
        "marked/lib/%2e%2e/package.json",
        "marked//lib/marked.esm.js/../../package.json",
    ]
    for path in refused:
        assert get(app, f"/vendor/{path}")[0] == 404, path
