"""Embedded-model benchmark, in one run:

- speed: tokens/s and time to first token through the whole app (WebSocket, flow, worker thread,
  the prompt evaluated in slices), against llama_cpp called directly in this process, for a short
  and a long prompt, medians over alternating repetitions; and the peak memory of the server;
- repetition: the share of repeated 4-grams of words in replies to ten plain questions, under
  llama_cpp's default sampling (the app's before) and under the app's, with a fixed seed.

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

from pocketchat.providers.local import CONTEXT_TOKENS, SAMPLING, default_model_path, without_extra_buffers
from tests.conftest import AppProcess

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}  # the app's default system prompt
PROMPTS = {
    "short prompt": "Write a long story about a lighthouse keeper.",
    # About 1,100 tokens: 17 slices for the app, 3 batches for llama_cpp.
    "long prompt": "Summarize this log.\n"
    + "\n".join(f"Night {n}: the keeper lit the lamp at dusk and trimmed the wick." for n in range(60)),
}
# The speed runs are greedy on both sides, with the app's repeat penalty on both: the same text.
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
# No sampling arguments: create_chat_completion's own (temperature 0.2, top_p 0.95, top_k 40,
# min_p 0.05, no repeat penalty), which the app used before.
LLAMA_CPP_DEFAULTS: dict[str, float] = {}
Timing = tuple[float, float]  # time to first token in ms, tokens/s after it


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


def direct(llama: llama_cpp.Llama, content: str, max_tokens: int) -> Timing:
    messages = [SYSTEM, {"role": "user", "content": content}]
    start = time.perf_counter()
    first, tokens = None, 0
    for chunk in llama.create_chat_completion(messages, stream=True, max_tokens=max_tokens, **GREEDY):
        if chunk["choices"][0]["delta"].get("content"):
            first = first or time.perf_counter()
            tokens += 1
    end = time.perf_counter()
    return (first - start) * 1000, tokens / (end - first)


def through_app(ws_url: str, content: str) -> Timing:
    with connect(ws_url) as ws:
        ws.send('{"type":"hello"}')
        while json.loads(ws.recv())["type"] != "ready":
            pass
        start = time.perf_counter()
        ws.send(json.dumps({"type": "message", "content": content}))
        first = None
        while True:
            frame = json.loads(ws.recv())
            if frame["type"] == "chunk" and first is None:
                first = time.perf_counter()
            if frame["type"] == "turn_end":
                end = time.perf_counter()
                assert frame["status"] == "complete", frame
                return (first - start) * 1000, frame["usage"]["completion_tokens"] / (end - first)


def speed(args: argparse.Namespace, llama: llama_cpp.Llama) -> tuple[dict[tuple[str, str], list[Timing]], float]:
    """Alternating runs, direct and through the app, of each prompt; and the server's peak memory.

    Each side alternates between the prompts, so neither finds the long one already in its cache."""
    with tempfile.TemporaryDirectory() as tmp:
        server = AppProcess(
            Path(tmp), ["--provider", "local", "--temperature", "0", "--max-tokens", str(args.max_tokens)]
        )
        try:
            server.start()
            through_app(server.ws_url, PROMPTS["short prompt"])  # warm both: weights loaded, caches filled
            direct(llama, PROMPTS["short prompt"], args.max_tokens)
            results: dict[tuple[str, str], list[Timing]] = {}
            for _ in range(args.repeat):
                for prompt, content in PROMPTS.items():
                    results.setdefault(("llama_cpp", prompt), []).append(direct(llama, content, args.max_tokens))
                    results.setdefault(("app", prompt), []).append(through_app(server.ws_url, content))
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


def describe(sampling: dict[str, float]) -> str:
    return ", ".join(f"{name} {value}" for name, value in sampling.items()) or "llama_cpp's defaults"


def median(timings: list[Timing]) -> Timing:
    return statistics.median(t[0] for t in timings), statistics.median(t[1] for t in timings)


def report_speed(args: argparse.Namespace, results: dict[tuple[str, str], list[Timing]], server_peak: float) -> None:
    print(
        f"SmolLM2-135M-Instruct Q4_1, {args.max_tokens} tokens max, {describe(GREEDY)}, "
        f"{args.repeat} runs each, medians"
    )
    for prompt in PROMPTS:
        base_ttft, base_rate = median(results["llama_cpp", prompt])
        app_ttft, app_rate = median(results["app", prompt])
        print(f"\n{prompt}:")
        print(f" llama_cpp: time to first token {base_ttft:7.1f} ms, {base_rate:6.1f} tokens/s")
        print(f"       app: time to first token {app_ttft:7.1f} ms, {app_rate:6.1f} tokens/s")
        print(f"ratio app/llama_cpp: tokens/s x{app_rate / base_rate:.2f}, first token x{app_ttft / base_ttft:.2f}")
    print(f"\npeak memory (VmHWM) of the server process: {server_peak:.0f} MiB")
    print(f"peak memory of this process (Python + llama_cpp + the same model): {peak_rss_mib():.0f} MiB")


def report_repetition(args: argparse.Namespace, before: list[float], after: list[float]) -> None:
    print(
        f"\nrepeated 4-grams of words, share per reply: {len(QUESTIONS)} questions, {args.reply_tokens} tokens max, "
        f"seed {args.seed}\n"
    )
    print(f"{'question':<48} {'before':>6} {'after':>6}")
    for question, old, new in zip(QUESTIONS, before, after, strict=True):
        print(f"{question:<48} {old:6.2f} {new:6.2f}")
    print()
    for name, sampling, shares in (("before", LLAMA_CPP_DEFAULTS, before), ("after", SAMPLING, after)):
        looping = sum(share > 0.2 for share in shares)
        print(
            f"{name:>6} ({describe(sampling)}): mean {statistics.mean(shares):.2f}, "
            f"median {statistics.median(shares):.2f}, {looping} of {len(shares)} replies over 0.2"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--reply-tokens", type=int, default=200, help="tokens per reply of the repetition runs")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    with without_extra_buffers():  # as the app loads it
        llama = llama_cpp.Llama(str(default_model_path()), n_ctx=CONTEXT_TOKENS, n_threads=2, verbose=False)
    results, server_peak = speed(args, llama)
    before = repetition(llama, LLAMA_CPP_DEFAULTS, args.reply_tokens, args.seed)
    after = repetition(llama, SAMPLING, args.reply_tokens, args.seed)
    report_speed(args, results, server_peak)
    report_repetition(args, before, after)


if __name__ == "__main__":
    main()
