"""Preparing a replay's requests against session length: time per state at two sizes, side by side.

Generates one session that reads a large file and then edits it ``n`` times (issue 30's case: 700 ``Edit``
calls, a 2.9 MB session file; ``tests/support/long_sessions.write_edit_session``), ingests it, and times
what ``composer-pipeline replay --plan-only`` does before it writes: ``ReplayRun.prepare`` (render, fit,
price, hash every state × teacher) and ``.plan`` (cache and ledger lookups, predictions). Each size runs
in its own process (its peak RSS is its own). Prints one JSON line per size and the ratio of time per
state, large over small: about 1 when preparing is linear in the session's length, about ``--factor``
when it is quadratic.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_prepare.py --n 175 --factor 4

``--baseline-src DIR`` also runs each size on another checkout's ``composer_pipeline`` (e.g. ``git archive
<commit> composer_pipeline | tar -x -C DIR``), in the same run, for a before/after on one machine.
``--window N`` gives the teacher a ``context_window`` (fitting runs too).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, resource, sys, tempfile, time
from pathlib import Path
from composer_pipeline.ingest.pipeline import ingest_paths
from composer_pipeline.render import RenderOptions
from composer_pipeline.teachers.cache import ResponseCache
from composer_pipeline.teachers.config import parse_teachers
from composer_pipeline.ledger import Ledger
from composer_pipeline.replay.run import ReplayRun
from tests.support.long_sessions import write_edit_session

n, file_chars, snippet_chars, window = (int(a) for a in sys.argv[1:5])
work = Path(tempfile.mkdtemp(prefix="bench-prepare-"))
path = write_edit_session(work / "sessions", n, file_chars=file_chars, snippet_chars=snippet_chars)
(res,) = list(ingest_paths([work / "sessions"]))
teachers = []
for name in ("a", "b"):
    t = dict(name=name, base_url="http://127.0.0.1:1/v1", model=f"m-{name}", api_key_env=None,
             input_usd_per_mtok=1.0, output_usd_per_mtok=1.0, budget_usd=1e6, max_concurrency=1, max_tokens=64)
    if window:
        t["context_window"] = window
    teachers.append(t)
cfg = parse_teachers({"ceiling_usd": 1e6, "teachers": teachers}, "bench")
cache, ledger = ResponseCache(work / "cache"), Ledger(work / "ledger.sqlite")  # opened (schema made) untimed
ledger.check_identities(cfg.identities())
ReplayRun(cfg, [], []).plan(cache, ledger)  # warm: imports and first queries, untimed
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
run = ReplayRun.prepare(res.states, res.messages, cfg, RenderOptions())
t1 = time.perf_counter()
plan = run.plan(cache, ledger)
t2 = time.perf_counter()
states = res.states.num_rows
print(json.dumps({
    "edits": n, "session_mb": round(path.stat().st_size / 1e6, 2), "states": states,
    "requests": plan.table.num_rows, "prepare_s": round(t1 - t0, 3), "plan_s": round(t2 - t1, 3),
    "ms_per_state": round(1000 * (t2 - t0) / states, 3),
    "prepare_ms_per_state": round(1000 * (t1 - t0) / states, 3), "plan_ms_per_state": round(1000 * (t2 - t1) / states, 3),
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    "rss_before_prepare_mb": rss0 // 1024,
}))
"""


def measure(n: int, args: argparse.Namespace, src: str | None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([p for p in (src, str(ROOT)) if p])  # src's composer_pipeline first
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(n), str(args.file_chars), str(args.snippet_chars), str(args.window)],
        env=env,
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=175, help="Edit calls of the small session")
    ap.add_argument("--factor", type=int, default=4, help="the large session has n × factor edits")
    ap.add_argument("--file-chars", type=int, default=200_000, help="the file read before the edits")
    ap.add_argument("--snippet-chars", type=int, default=2_000, help="each Edit's result")
    ap.add_argument("--window", type=int, default=0, help="teachers' context_window (0: none)")
    ap.add_argument("--baseline-src", default=None, help="a checkout whose composer_pipeline runs as the baseline")
    args = ap.parse_args()
    sides = [("now", None)] + ([("baseline", args.baseline_src)] if args.baseline_src else [])
    for label, src in sides:
        small, large = measure(args.n, args, src), measure(args.n * args.factor, args, src)
        for row in (small, large):
            print(json.dumps({"code": label, **row}))
        ratios = {k: large[k] / small[k] for k in ("ms_per_state", "prepare_ms_per_state", "plan_ms_per_state")}
        print(
            f"{label}: time per state ×{ratios['ms_per_state']:.2f} for ×{args.factor} edits "
            f"(prepare ×{ratios['prepare_ms_per_state']:.2f}, plan ×{ratios['plan_ms_per_state']:.2f}; "
            f"1 = linear, {args.factor} = quadratic); peak RSS {small['peak_rss_mb']} → {large['peak_rss_mb']} MB"
        )


if __name__ == "__main__":
    main()
