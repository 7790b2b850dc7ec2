"""What a misbehaving MCP server costs everyone else's chat (issue 30 rows 11 and 12): the time of short
turns (5 tokens, the fake provider) in a conversation that calls no tool, while the operator's one MCP
server (tests/mcp_server.py) floods its stdout with 100 MB and no newline (started again each time it is
stopped), or lists 10,000 tools; against the same turns with no MCP server, in the same run.

    python -m bench.mcp_servers                       # this checkout
    python -m bench.mcp_servers --root /path/to/other # another checkout's app (the same test server)
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tests.conftest import NO_LIMITS, ROOT, AppProcess
from tests.fake_openai import FakeOpenAIThread
from tests.test_protocol import wait_for

SCENARIOS = {
    "no MCP server": None,
    "flood: 100 MB, no newline": ["--flood", "100000000"],
    "10,000 tools": ["--many-tools", "10000"],
}


def turn_times(app: AppProcess, turns: int, pause: float) -> list[float]:
    client = app.client()
    client.hello()
    took = []
    for n in range(turns):
        started = time.monotonic()
        assert client.turn(f"hello {n}", timeout=60)[-1]["status"] == "complete"
        took.append(time.monotonic() - started)
        time.sleep(pause)
    return took


def run(root: Path, port: int, flags: list[str] | None, args: argparse.Namespace) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        options = ["--base-url", f"http://127.0.0.1:{port}/v1", *NO_LIMITS]
        if flags is not None:
            config = Path(tmp) / "mcp.json"
            server = {"command": sys.executable, "args": [str(ROOT / "tests" / "mcp_server.py"), *flags]}
            config.write_text(json.dumps({"mcpServers": {"bench": server}}))
            options += ["--mcp-config", str(config)]
        app = AppProcess(Path(tmp), options, root=root)
        try:
            app.start()
            wait_for(lambda: "MCP server bench" in app.logs() or flags is None, 30)
            return turn_times(app, args.turns, args.pause)
        finally:
            app.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose app runs")
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--pause", type=float, default=0.3, help="seconds between turns")
    args = parser.parse_args()
    print(f"{args.root}: {args.turns} turns of 5 tokens, {args.pause} s apart")
    with FakeOpenAIThread() as fake:
        for name, flags in SCENARIOS.items():
            took = sorted(1000 * t for t in run(args.root, fake.port, flags, args))
            p90 = took[int(0.9 * (len(took) - 1))]
            print(f"  {name:28} median {statistics.median(took):7.1f} ms  p90 {p90:7.1f} ms  max {took[-1]:7.1f} ms")


if __name__ == "__main__":
    main()
