"""What prompt caching and window fitting do to a replay's bill, against the loopback provider emulator.

Generates long multi-turn Claude Code sessions (tests/support/long_sessions.py; or ingests a
real corpus with ``--traces DIR``), ingests them with the real CLI, and replays every state to a
3-teacher recipe through the real client, ledger and cache:

* ``gpt-128k``: OpenAI-style, 128 k window, cached input at 0.1× (automatic caching, prompt_cache_key);
* ``claude-200k``: native Anthropic Messages API, 200 k window, reads 0.1×, writes 1.25× (breakpoints);
* ``gpt-32k``: OpenAI-style, 32 k window (prefixes over it are fitted), cached input at 0.1×.

Reported per teacher: states answered (share), billed $ (what the emulator invoiced = what the ledger
recorded, and their difference), the same tokens at full price (what the replay recorded before caching
was priced, and what a provider without caching bills), $ per answered state and per kept pair,
requests sent over a window; and the wall time of session-affine scheduling (``scheduling: stream``)
against every call at once (``scheduling: all``, today's default before this change) at the same
concurrency and emulated latency, with what each was billed.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_caching.py [--sessions 12] [--turns 60] [--latency 0.2] [--traces DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import pyarrow.parquet as pq

from composer_pipeline.ledger import Ledger
from composer_pipeline.ledger.billing import usage_by_run
from composer_pipeline.pairs.build import build_pairs
from composer_pipeline.pairs.config import PairRecipe
from composer_pipeline.render import RenderOptions
from composer_pipeline.replay.run import ReplayRun
from composer_pipeline.teachers.cache import ResponseCache
from composer_pipeline.teachers.config import parse_teachers

# the test helpers (tests/support) live in the checkout
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.long_sessions import write_long_sessions  # noqa: E402
from tests.support.provider_emulator import ModelRules, ProviderEmulator  # noqa: E402

# $/Mtok: input, output, cached read, cache write (list-price-like: a GPT-4.1-class, a Sonnet-class, a mini-class model)
MODELS = {
    "gpt-128k": ("openai", 128_000, 2.0, 8.0, 0.2, 0.0),
    "claude-200k": ("anthropic", 200_000, 3.0, 15.0, 0.3, 3.75),
    "gpt-32k": ("openai", 32_000, 0.4, 1.6, 0.04, 0.0),
}


def teachers_config(url: str, scheduling: str, concurrency: int):
    entries = []
    for name, (api, window, inp, out, cached, write) in MODELS.items():
        d = dict(
            name=name,
            base_url=url,
            model=name,
            api_key_env=None,
            api=api,
            input_usd_per_mtok=inp,
            output_usd_per_mtok=out,
            cached_input_usd_per_mtok=cached,
            budget_usd=1000.0,
            max_concurrency=concurrency,
            max_tokens=256,
            timeout_s=60.0,
            context_window=window,
        )
        if write:
            d["cache_write_usd_per_mtok"] = write
        entries.append(d)
    return parse_teachers({"ceiling_usd": 1000.0, "scheduling": scheduling, "teachers": entries}, "bench_caching")


def emulator(latency: float) -> ProviderEmulator:
    return ProviderEmulator(
        {
            name: ModelRules(api, window, inp, out, cached, write)
            for name, (api, window, inp, out, cached, write) in MODELS.items()
        },
        latency_s=latency,
    ).start()


def one_run(states, messages, scheduling: str, latency: float, concurrency: int, work: Path) -> dict:
    emu = emulator(latency)
    try:
        cfg = teachers_config(emu.url, scheduling, concurrency)
        ledger, cache = Ledger(work / f"ledger-{scheduling}.sqlite"), ResponseCache(work / f"cache-{scheduling}")
        run = ReplayRun.prepare(states, messages, cfg, RenderOptions())
        plan = run.plan(cache, ledger)
        reqs = run.requests
        sizes = sorted(
            len(orjson.dumps(r.source[0] if r.source else r.body["messages"]))
            for r in reqs
            if r.teacher.name == "claude-200k"
        )
        prefix_chars = (
            {
                "p50": sizes[len(sizes) // 2],
                "p90": sizes[int(0.9 * (len(sizes) - 1))],
                "max": sizes[-1],
            }
            if sizes
            else {}
        )
        t0 = time.perf_counter()
        res = run.replay({}, cache=cache, ledger=ledger, run_id=scheduling)
        wall = time.perf_counter() - t0
        rows = res.table.to_pylist()
        pairs = build_pairs(states, messages, res.table, PairRecipe(), RenderOptions(), teachers=cfg)
        n_pairs = pairs.pairs.num_rows
        billed = usage_by_run(ledger, scheduling)
        n_states = states.num_rows
        per: dict[str, dict] = {}
        for t in cfg.teachers:
            mine = [r for r in rows if r["teacher"] == t.name]
            answered = sum(r["status"] == "answered" for r in mine)
            b = billed.get(t.name, {})
            emu_usd = emu.billed_usd(t.model)
            rec = b.get("billed_usd", 0.0)
            per[t.name] = {
                "answered": answered,
                "answered_share": round(answered / n_states, 4),
                "fitted": sum(
                    1 for r in mine if r["status"] == "answered" and (r["elided_messages"] or r["cut_messages"])
                ),
                "billed_usd": round(rec, 6),
                "emulator_billed_usd": round(emu_usd, 6),
                "recorded_vs_emulator_pct": round(100 * (rec - emu_usd) / emu_usd, 6) if emu_usd else None,
                "full_price_usd": round(b.get("full_price_usd", 0.0), 6),
                "saving_x": round(b.get("full_price_usd", 0.0) / rec, 2) if rec else None,
                "usd_per_answered_state": round(rec / answered, 6) if answered else None,
                "full_price_usd_per_answered_state": round(b.get("full_price_usd", 0.0) / answered, 6)
                if answered
                else None,
                "predicted_usd": round(plan.predicted_by_teacher[t.name], 6),
                "worst_case_usd": round(plan.worst_case_by_teacher[t.name], 6),
                "prompt_tokens": b.get("prompt_tokens", 0),
                "cached_prompt_tokens": b.get("cached_prompt_tokens", 0),
                "over_window_sent": sum(1 for m, _ in emu.over_window if m == t.model),
            }
        total = sum(p["billed_usd"] for p in per.values())
        full = sum(p["full_price_usd"] for p in per.values())
        return {
            "scheduling": scheduling,
            "wall_s": round(wall, 2),
            "requests": len(reqs),
            "states": n_states,
            "kept_pairs": n_pairs,
            "billed_usd": round(total, 6),
            "full_price_usd": round(full, 6),
            "usd_per_kept_pair": round(total / n_pairs, 6) if n_pairs else None,
            "full_price_usd_per_kept_pair": round(full / n_pairs, 6) if n_pairs else None,
            "sessions": len(set(states.column("session_key").to_pylist())),
            "over_window_sent": len(emu.over_window),
            "prefix_bytes": prefix_chars,
            "by_teacher": per,
        }
    finally:
        emu.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--turns", type=int, default=60)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--latency", type=float, default=0.2, help="emulated seconds per answer")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--traces", default=None, help="ingest this directory of real Claude Code sessions instead")
    ap.add_argument("--schedulings", default="stream,all")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        src = Path(args.traces) if args.traces else work / "projects"
        if not args.traces:
            write_long_sessions(src, args.sessions, args.turns, args.seed)
        subprocess.run(
            [sys.executable, "-m", "composer_pipeline", "ingest", str(src), "--out", str(work / "data")],
            check=True,
            capture_output=True,
            timeout=600,
        )
        states, messages = (
            pq.read_table(work / "data/trace_states.parquet"),
            pq.read_table(work / "data/trace_messages.parquet"),
        )
        for sched in args.schedulings.split(","):
            print(json.dumps(one_run(states, messages, sched, args.latency, args.concurrency, work)), flush=True)


if __name__ == "__main__":
    main()
