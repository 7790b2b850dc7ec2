"""Embedded-model benchmark: tokens/s and time to first token through the whole app (WebSocket,
flow, worker thread), against llama_cpp called directly in this process, in the same run, with
medians over alternating repetitions; and the peak memory of the server process.

    .venv/bin/python -m bench.local_model [--repeat 5] [--max-tokens 128]
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import llama_cpp
from websockets.sync.client import connect

from tests.conftest import AppProcess
from utils.local_provider import CONTEXT_TOKENS, default_model_path

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write a long story about a lighthouse keeper."},
]


def peak_rss_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def direct(llama: llama_cpp.Llama, max_tokens: int) -> tuple[float, float]:
    start = time.perf_counter()
    first, tokens = None, 0
    for chunk in llama.create_chat_completion(MESSAGES, stream=True, max_tokens=max_tokens, temperature=0):
        if chunk["choices"][0]["delta"].get("content"):
            first = first or time.perf_counter()
            tokens += 1
    end = time.perf_counter()
    return (first - start) * 1000, tokens / (end - first)


def through_app(ws_url: str) -> tuple[float, float]:
    with connect(ws_url) as ws:
        ws.send('{"type":"hello"}')
        while json.loads(ws.recv())["type"] != "ready":
            pass
        start = time.perf_counter()
        ws.send(json.dumps({"type": "message", "content": MESSAGES[1]["content"]}))
        first = None
        while True:
            frame = json.loads(ws.recv())
            if frame["type"] == "chunk" and first is None:
                first = time.perf_counter()
            if frame["type"] == "turn_end":
                end = time.perf_counter()
                assert frame["status"] == "complete", frame
                return (first - start) * 1000, frame["usage"]["completion_tokens"] / (end - first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = AppProcess(
            Path(tmp), ["--provider", "local", "--temperature", "0", "--max-tokens", str(args.max_tokens)]
        )
        try:
            server.start()
            llama = llama_cpp.Llama(str(default_model_path()), n_ctx=CONTEXT_TOKENS, n_threads=2, verbose=False)
            through_app(server.ws_url)  # warm both: weights loaded, caches filled
            direct(llama, args.max_tokens)
            results: dict[str, list[tuple[float, float]]] = {"llama_cpp": [], "app": []}
            for _ in range(args.repeat):
                results["llama_cpp"].append(direct(llama, args.max_tokens))
                results["app"].append(through_app(server.ws_url))
            assert server.process is not None
            server_peak = peak_rss_mib(server.process.pid)
        finally:
            server.stop()
    medians = {
        who: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)) for who, rs in results.items()
    }
    print(
        f"SmolLM2-135M-Instruct Q4_1, {args.max_tokens} tokens max, temperature 0, {args.repeat} runs each, medians\n"
    )
    for who, (ttft, rate) in medians.items():
        print(f"{who:>10}: time to first token {ttft:7.1f} ms, {rate:6.1f} tokens/s")
    (app_ttft, app_rate), (base_ttft, base_rate) = medians["app"], medians["llama_cpp"]
    print(
        f"\nratio app/llama_cpp: tokens/s x{app_rate / base_rate:.2f}, time to first token x{app_ttft / base_ttft:.2f}"
    )
    print(f"peak memory (VmHWM) of the server process: {server_peak:.0f} MiB")
    print(f"peak memory of this process (Python + llama_cpp + the same model): {peak_rss_mib():.0f} MiB")


if __name__ == "__main__":
    main()
