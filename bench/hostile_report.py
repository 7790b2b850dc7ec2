"""The targets of bench/hostile.py, and its report: a row's medians, whether it meets them, the table."""

import statistics
from math import nan
from typing import Any

TARGET_LIVEZ_MS = 100.0  # /livez p99 while mallory replays the row
TARGET_RATIO = 2.0  # bob's p99 first chunk (and his probe's p99), hostile over quiet
PROBE_SLACK = 1.0  # seconds a probe may take beyond 2x its quiet p99 (a quiet probe takes milliseconds)


def ms(value: float) -> str:
    return "-" if value != value else f"{value:,.0f}"  # nan: nothing measured


def one_line(run: dict[str, Any]) -> str:
    shown = ("livez_p99_ms", "first_chunk_p99_ms", "turn_p99_ms", "probe_p99_ms", "peak_rss_mb", "turns")
    return ", ".join(f"{name} {ms(run.get(name, nan))}" for name in shown) + f"; mallory: {run['mallory']}"


def middle(runs: list[dict[str, Any]], name: str) -> float:
    values = [r[name] for r in runs if name in r]
    return statistics.median(values) if values else nan


def verdict(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The medians, and whether the row meets its targets (and if not, which)."""
    quiet, hostile = runs["quiet"], runs["hostile"]
    figures = {
        f"{name}_{kind}": middle(of, name)
        for name in ("livez_p99_ms", "first_chunk_p99_ms", "turn_p99_ms", "probe_p99_ms", "peak_rss_mb", "peak_tmp_mb")
        for kind, of in (("quiet", quiet), ("hostile", hostile))
    }
    figures["first_chunk_ratio"] = figures["first_chunk_p99_ms_hostile"] / figures["first_chunk_p99_ms_quiet"]
    missed = []
    if not figures["livez_p99_ms_hostile"] < TARGET_LIVEZ_MS:
        missed.append("livez")
    cut_short = any(r.get("turns", 0) < r.get("turns_asked", 0) for r in hostile)  # the row's time ran out first
    if cut_short or not figures["first_chunk_ratio"] <= TARGET_RATIO:
        missed.append("bob's turns")
    probe_quiet, probe_hostile = figures["probe_p99_ms_quiet"], figures["probe_p99_ms_hostile"]
    if probe_quiet == probe_quiet and not probe_hostile <= max(
        TARGET_RATIO * probe_quiet, probe_quiet + 1000 * PROBE_SLACK
    ):
        missed.append("bob's probe")
    if not all(r["mallory"].get("finished") for r in hostile):
        missed.append("mallory unanswered")
    return {**figures, "met": not missed, "missed": missed}


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| # | mallory sends | /livez p99 ms quiet → hostile | bob's first chunk p99 ms quiet → hostile (x) "
        "| bob's whole turn p99 ms | bob's probe p99 ms | what mallory got | peak RSS MB (tmp MB) | met? |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        got = r["runs"]["hostile"][-1]["mallory"] if r["runs"]["hostile"] else {}
        answer = f"{got.get('answer', '?')} ({got.get('seconds', 0):.1f} s)".replace("|", "/")
        extra = ", ".join(f"{k} {v}" for k, v in got.items() if k not in ("answer", "seconds", "finished"))
        if r["hostile_app"]:  # the server runs from the app's start: how long that took, what it offers
            starts = (middle(r["runs"][kind], "app_start_s") for kind in ("quiet", "hostile"))
            extra += ("; " if extra else "") + "app start {:.1f} → {:.1f} s".format(*starts)
            offered = r["runs"]["hostile"][-1].get("provider", {}).get("most_tools_offered", 0)
            extra += f", {offered:,.0f} tools a request"
        probe = f"{r['probe']}: {ms(r['probe_p99_ms_quiet'])} → {ms(r['probe_p99_ms_hostile'])}" if r["probe"] else "-"
        lines.append(
            f"| {r['number']} | {r['what']} | {ms(r['livez_p99_ms_quiet'])} → {ms(r['livez_p99_ms_hostile'])} "
            f"| {ms(r['first_chunk_p99_ms_quiet'])} → {ms(r['first_chunk_p99_ms_hostile'])} "
            f"(x{r['first_chunk_ratio']:.1f}) | {ms(r['turn_p99_ms_quiet'])} → {ms(r['turn_p99_ms_hostile'])} "
            f"| {probe} | {answer}{'; ' + extra if extra else ''} "
            f"| {ms(r['peak_rss_mb_quiet'])} → {ms(r['peak_rss_mb_hostile'])} ({ms(r['peak_tmp_mb_hostile'])}) "
            f"| {'yes' if r['met'] else 'no: ' + ', '.join(r['missed'])} |"
        )
    return "\n".join(lines)
