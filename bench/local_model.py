"""Embedded-model benchmark: tokens/s and time to first token through the whole app (WebSocket,
flow, worker thread), against llama_cpp called directly in this process, in the same run, with
medians over alternating repetitions; the peak memory of the server process; and how often replies
repeat themselves under llama_cpp's default sampling and under the app's.

    .venv/bin/python -m bench.local_model [--repeat 5] [--max-tokens 128] [--reply-tokens 200] [--seed 42]
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import llama_cpp
from websockets.sync.client import connect

from tests.conftest import AppProcess
from utils.local_provider import CONTEXT_TOKENS, SAMPLING, default_model_path

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
MESSAGES = [SYSTEM, {"role": "user", "content": "Write a long story about a lighthouse keeper."}]
# The speed runs are greedy on both sides, with the app's penalties on both, so both write the same text.
GREEDY = {**SAMPLING, "temperature": 0}
# Plain requests, as people type them to the demo model.
QUESTIONS = [
    "Tell me about the sea.",
    "Write a short story about a lighthouse keeper.",
    "What is the capital of France?",
    "Give me three tips for better sleep.",
    "Explain how a rainbow forms.",
    "Describe your favourite season.",
    "What should I cook for dinner tonight?",
    "Write a poem about mountains.",
    "How do plants make food?",
    "Tell me about dogs.",
]
# What create_chat_completion uses when given no sampling: the embedded provider's choice before.
LLAMA_CPP_DEFAULTS: dict[str, float] = {}


def peak_rss_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def repeated_4gram_share(text: str) -> float:
    """Share of a text's 4-grams of whitespace-separated words that already occurred earlier in it."""
    words = text.split()
    seen: set[tuple[str, ...]] = set()
    repeated = 0
    for start in range(len(words) - 3):
        gram = tuple(words[start : start + 4])
        repeated += gram in seen
        seen.add(gram)
    return repeated / max(len(words) - 3, 1)


def direct(llama: llama_cpp.Llama, max_tokens: int) -> tuple[float, float]:
    start = time.perf_counter()
    first, tokens = None, 0
    for chunk in llama.create_chat_completion(MESSAGES, stream=True, max_tokens=max_tokens, **GREEDY):
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


def speed(args: argparse.Namespace, llama: llama_cpp.Llama) -> tuple[dict[str, list[tuple[float, float]]], float]:
    """Alternating runs through the app and direct; and the server's peak memory."""
    with tempfile.TemporaryDirectory() as tmp:
        server = AppProcess(
            Path(tmp), ["--provider", "local", "--temperature", "0", "--max-tokens", str(args.max_tokens)]
        )
        try:
            server.start()
            through_app(server.ws_url)  # warm both: weights loaded, caches filled
            direct(llama, args.max_tokens)
            results: dict[str, list[tuple[float, float]]] = {"llama_cpp": [], "app": []}
            for _ in range(args.repeat):
                results["llama_cpp"].append(direct(llama, args.max_tokens))
                results["app"].append(through_app(server.ws_url))
            assert server.process is not None
            return results, peak_rss_mib(server.process.pid)
        finally:
            server.stop()


def repetition(llama: llama_cpp.Llama, sampling: dict[str, Any], tokens: int, seed: int) -> list[float]:
    """The repeated 4-gram share of the reply to each question; the seed makes each reply repeatable."""
    shares = []
    for question in QUESTIONS:
        messages = [SYSTEM, {"role": "user", "content": question}]
        reply = llama.create_chat_completion(messages, max_tokens=tokens, seed=seed, **sampling)
        shares.append(repeated_4gram_share(reply["choices"][0]["message"]["content"]))
    return shares


def report_speed(args: argparse.Namespace, results: dict[str, list[tuple[float, float]]], server_peak: float) -> None:
    medians = {
        who: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)) for who, rs in results.items()
    }
    print(
        f"SmolLM2-135M-Instruct Q4_1, {args.max_tokens} tokens max, temperature 0 (top_p 0.9, repeat penalty 1.1), "
        f"{args.repeat} runs each, medians\n"
    )
    for who, (ttft, rate) in medians.items():
        print(f"{who:>10}: time to first token {ttft:7.1f} ms, {rate:6.1f} tokens/s")
    (app_ttft, app_rate), (base_ttft, base_rate) = medians["app"], medians["llama_cpp"]
    print(
        f"\nratio app/llama_cpp: tokens/s x{app_rate / base_rate:.2f}, time to first token x{app_ttft / base_ttft:.2f}"
    )
    print(f"peak memory (VmHWM) of the server process: {server_peak:.0f} MiB")


def report_repetition(args: argparse.Namespace, before: list[float], after: list[float]) -> None:
    print(
        f"\nrepeated 4-grams of words, share per reply: {len(QUESTIONS)} questions, {args.reply_tokens} tokens max, "
        f"seed {args.seed}\n"
    )
    print(f"{'question':<48} {'before':>6} {'after':>6}")
    for question, old, new in zip(QUESTIONS, before, after, strict=True):
        print(f"{question:<48} {old:6.2f} {new:6.2f}")
    print()
    for name, sampling, shares in (("before", "llama_cpp's defaults", before), ("after", SAMPLING, after)):
        looping = sum(share > 0.2 for share in shares)
        print(
            f"{name:>6} ({sampling}): mean {statistics.mean(shares):.2f}, median {statistics.median(shares):.2f}, "
            f"{looping} of {len(shares)} replies over 0.2"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--reply-tokens", type=int, default=200, help="tokens per reply of the repetition runs")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    llama = llama_cpp.Llama(str(default_model_path()), n_ctx=CONTEXT_TOKENS, n_threads=2, verbose=False)
    results, server_peak = speed(args, llama)
    before = repetition(llama, LLAMA_CPP_DEFAULTS, args.reply_tokens, args.seed)
    after = repetition(llama, SAMPLING, args.reply_tokens, args.seed)
    report_speed(args, results, server_peak)
    print(f"peak memory of this process (Python + llama_cpp + the same model): {peak_rss_mib():.0f} MiB")
    report_repetition(args, before, after)


if __name__ == "__main__":
    main()
