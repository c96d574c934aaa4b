"""Ingest benchmark: throughput (MB per CPU-second) vs the orjson decode floor, and peak RSS.

Generates a corpus of copies of the real traces (the directory ``COMPOSER_REAL_TRACES`` names: the
fingerprint below was recorded on that set) with rewritten uuids into
/tmp (default ~500 MB), then in the same run measures
  * floor:  read every file and ``orjson.loads`` every line (nothing else), CPU seconds;
  * ingest: the CLI's work: discover + scrub + parse + streams/states + Parquet (zstd) writing,
    session by session, in a child process whose peak RSS (ru_maxrss) is reported. The default engine
    runs (the compiled one where built: ``engine`` and ``python_fallback_sessions`` say what ran);
    ``--compare-python`` also times the Python reference engine, with its own floor run.
Targets: ingest >= 0.4x the floor's MB/CPU-s; peak RSS < 300 MB.

Output check: before timing, the real traces and the bundled samples are ingested under three
recipes (defaults; ``compaction: full`` + thinking kept; an extra secret pattern) and a hash of
every row of the three tables, the file reports and the secret counts is compared with
``bench/ingest_output_fingerprint.json`` (recorded from the code before any speed work), so a
faster ingest that changes its output fails loudly. ``--record-fingerprint`` rewrites that file.

    COMPOSER_REAL_TRACES=<dir> OMP_NUM_THREADS=1 .venv/bin/python bench/bench_ingest.py [--mb 500] [--repeat 3] [--compare-python] [--keep]
                                                             [--record-fingerprint]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRACES = Path(os.environ.get("COMPOSER_REAL_TRACES", ""))
UUID_RE = re.compile(rb"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-)([0-9a-f]{12})")


def generate(corpus: Path, target_mb: float) -> tuple[int, int]:
    files = sorted(p for p in TRACES.rglob("*.jsonl"))
    blobs = {p.relative_to(TRACES): p.read_bytes() for p in files}
    per_copy = sum(len(b) for b in blobs.values())
    copies = max(1, int(target_mb * 1e6 // per_copy))
    if corpus.exists():
        shutil.rmtree(corpus)
    total = 0
    for k in range(copies):
        def sub(m, k=k):
            return m.group(1) + b"%012x" % (int(m.group(2), 16) ^ (k + 1))
        for rel, data in blobs.items():
            out = corpus / f"copy{k:04d}" / rel
            if rel.stem.count("-") == 4:  # session files are named by their uuid: rename consistently
                out = out.with_name(sub(UUID_RE.match(rel.stem.encode())).decode() + ".jsonl")
            out.parent.mkdir(parents=True, exist_ok=True)
            data = UUID_RE.sub(sub, data)
            out.write_bytes(data)
            total += len(data)
    return copies, total


FINGERPRINT = REPO / "bench" / "ingest_output_fingerprint.json"
FINGERPRINT_RECIPES = {
    "default": {},
    "full_keep_thinking": {"render": {"compaction": "full", "strip_thinking": False}},
    "extra_pattern": {"extra_secret_patterns": {"custom": "[0-9a-f]{8}-[0-9a-f]{4}-4"}},
}


def _message_row_v1(row: dict) -> dict:
    """A ``trace_messages`` row in the column layout the fingerprint was recorded with: ``content`` and
    ``tool_use_result`` (since stored only inside ``raw``) decoded from ``raw`` and re-serialized as the
    recording code did, so the check proves they are still exactly recoverable."""
    import orjson

    from composer_pipeline.render import record_payload

    content, tur = record_payload(row["raw"], row["record_type"])
    v1 = {}
    for k, v in row.items():
        if k == "is_meta":
            v1["content"] = None if content is None else orjson.dumps(content).decode()
            v1["tool_use_result"] = None if tur is None else orjson.dumps(tur).decode()
        v1[k] = v
    return v1


def fingerprint() -> dict:
    """sha256 over every output row (sorted-key JSON, table order) per recipe and table."""
    import hashlib

    import orjson

    from composer_pipeline.ingest.pipeline import ingest_paths
    from composer_pipeline.ingest.recipe import IngestRecipe

    roots = [TRACES, REPO / "composer_pipeline" / "samples" / "projects"]
    out = {}
    for name, recipe in FINGERPRINT_RECIPES.items():
        h = {t: hashlib.sha256() for t in ("trace_states", "trace_messages", "quarantine", "reports")}
        rows = dict.fromkeys(h, 0)
        for res in ingest_paths(roots, IngestRecipe.from_dict(recipe)):
            for t, tab in (("trace_states", res.states), ("trace_messages", res.messages), ("quarantine", res.quarantine)):
                for row in tab.to_pylist():
                    if t == "trace_messages":
                        row = _message_row_v1(row)
                    h[t].update(orjson.dumps(row, option=orjson.OPT_SORT_KEYS))
                    rows[t] += 1
            h["reports"].update(orjson.dumps([res.file_reports, list(res.secrets.items()), res.stats],  # secrets: in order
                                             option=orjson.OPT_SORT_KEYS))
            rows["reports"] += 1
        out[name] = {t: f"{rows[t]}:{h[t].hexdigest()[:32]}" for t in h}
    return out


def floor(corpus: Path) -> float:
    import orjson

    t = time.process_time()
    n = 0
    for p in sorted(corpus.rglob("*.jsonl")):
        for line in p.read_bytes().split(b"\n"):
            if line:
                orjson.loads(line)
                n += 1
    return time.process_time() - t


def child(corpus: Path, out: Path, engine: str) -> None:
    """The ingest run (same code path as `composer-pipeline ingest`), reporting its own CPU and RSS."""
    import io

    t0 = time.process_time()
    import pyarrow.parquet  # noqa: F401  (imports are startup, reported separately)

    import composer_pipeline.cli.ingest  # noqa: F401
    import composer_pipeline.ingest.pipeline  # noqa: F401
    import composer_pipeline.store  # noqa: F401  (fsspec: imported by `run`, a fixed cost)
    import pandas  # noqa: F401  (pyarrow imports it at the first pa.array call: 0.3-0.5 CPU-s once per process)
    from composer_pipeline.cli import main

    startup = time.process_time() - t0
    captured = io.StringIO()  # the CLI's JSON lines (one per file, then the totals line)
    t = time.process_time()
    stdout, sys.stdout = sys.stdout, captured
    try:
        rc = main(["ingest", str(corpus), "--out", str(out), "--engine", engine])
    finally:
        sys.stdout = stdout
    cpu = time.process_time() - t
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    totals = json.loads(captured.getvalue().splitlines()[-1])
    print(json.dumps({"rc": rc, "cpu_s": cpu, "startup_cpu_s": startup, "peak_rss_mb": rss_mb,
                      "engine": totals["engine"], "python_fallback_sessions": totals["python_fallback_sessions"]}))


def run_child(corpus: Path, engine: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", "--corpus", str(corpus), "--engine", engine],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode:
        sys.exit(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=500)
    ap.add_argument("--corpus", default="/tmp/composer_bench_corpus")
    ap.add_argument("--keep", action="store_true", help="keep the generated corpus and output")
    ap.add_argument("--repeat", type=int, default=1, help="floor+ingest pairs to run; the median ratio is reported")
    ap.add_argument("--record-fingerprint", action="store_true", help="rewrite the expected-output fingerprint")
    ap.add_argument("--compare-python", action="store_true",
                    help="also time the Python reference engine once, back to back with a floor run")
    ap.add_argument("--engine", default="auto", help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    corpus, out = Path(args.corpus), Path(args.corpus + "_out")
    if args.child:
        child(corpus, out, args.engine)
        return
    if not TRACES.name or not TRACES.is_dir():
        sys.exit("set COMPOSER_REAL_TRACES to the directory of real Claude Code sessions the fingerprint was "
                 f"recorded on (got {str(TRACES)!r})")
    got = fingerprint()
    if args.record_fingerprint:
        FINGERPRINT.write_text(json.dumps(got, indent=1) + "\n")
    expected = json.loads(FINGERPRINT.read_text())
    if got != expected:
        sys.exit(f"ingest output changed (vs {FINGERPRINT.name}):\n{json.dumps(got, indent=1)}")
    copies, nbytes = generate(corpus, args.mb)
    mb = nbytes / 1e6
    runs = []  # each run: floor then ingest back to back, so both see about the same machine load
    for _ in range(args.repeat):
        f_cpu = floor(corpus)
        res = run_child(corpus, "auto")
        runs.append((f_cpu / res["cpu_s"], f_cpu, res))
    runs.sort(key=lambda r: r[0])
    ratio, f_cpu, res = runs[len(runs) // 2]  # the median run by ratio
    floor_tp, ingest_tp = mb / f_cpu, mb / res["cpu_s"]
    report = {
        "output_unchanged": True,  # checked above against the recorded fingerprint
        "corpus_mb": round(mb, 1), "copies": copies, "runs": len(runs),
        "floor_cpu_s": round(f_cpu, 2), "floor_mb_per_cpu_s": round(floor_tp, 1),
        "ingest_cpu_s": round(res["cpu_s"], 2), "ingest_mb_per_cpu_s": round(ingest_tp, 1),
        "startup_cpu_s": round(res["startup_cpu_s"], 2),  # interpreter imports, not in ingest_cpu_s
        "ratio_vs_floor": round(ratio, 3), "target_ratio": 0.4,
        "ratio_all_runs": [round(r[0], 3) for r in runs],
        "peak_rss_mb": round(max(r[2]["peak_rss_mb"] for r in runs), 1), "target_rss_mb": 300,
        "output_mb": round(sum(p.stat().st_size for p in out.glob("*.parquet")) / 1e6, 1),
        "engine": res["engine"], "python_fallback_sessions": max(r[2]["python_fallback_sessions"] for r in runs),
    }
    if args.compare_python:  # the reference engine on the same corpus, with its own floor run
        f_cpu = floor(corpus)
        ref = run_child(corpus, "python")
        report["python_engine"] = {"cpu_s": round(ref["cpu_s"], 2), "ratio_vs_floor": round(f_cpu / ref["cpu_s"], 3),
                                   "peak_rss_mb": round(ref["peak_rss_mb"], 1)}
        report["speedup_vs_python_engine"] = round(ref["cpu_s"] / res["cpu_s"], 2)
    print(json.dumps(report, indent=1))
    if not args.keep:
        shutil.rmtree(corpus, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
