"""The budget ledger under load: per-call overhead, and replay throughput of K concurrent runs sharing one ledger.

1. **Overhead per call** (``--overhead N``): the ledger work one paid call does, timed call by call in
   one process: claim → reserve → mark sent → settle with the answer stored (4 transactions). Reports
   p50/p95/max in ms per backend (target: p95 < 2 ms on SQLite).
2. **Throughput** (``--runs 1,2,4,8``): K replay processes (each C concurrent calls, ``rounds·C``
   distinct requests) start together against one scripted server (its own process, every answer
   delayed by L seconds) and one ledger. Reports aggregate calls/s and its ratio to the ideal K·C/L,
   next to K bare-httpx processes sending the same bodies (no ledger, cache or parsing) in the same
   run: what is the machine's limit (2 shared cores) and what is the replay client's and ledger's.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_ledger.py [--postgres URL] [--runs 1,2,4,8] [--c 8] [--latency 0.5]

``--postgres URL`` adds the PostgreSQL backend (a server you started; each run uses a fresh database).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _teachers(url: str, c: int, name: str = "bench") -> dict:
    return {
        "ceiling_usd": 1e6,
        "lease_s": 30,
        "teachers": [
            dict(
                name=name,
                base_url=url,
                model="scripted",
                api_key_env=None,
                input_usd_per_mtok=1.0,
                output_usd_per_mtok=2.0,
                budget_usd=1e6,
                max_concurrency=c,
                max_tokens=64,
                temperature=0.0,
                timeout_s=30,
                max_retries=0,
            )
        ],
    }


def _requests(cfg, n: int, tag: str):
    from composer_pipeline.replay.requests import make_request

    tools = [
        {
            "type": "function",
            "function": {
                "name": "Read",
                "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}}},
            },
        }
    ]
    return [
        make_request(
            f"{tag}{i}",
            "bench",
            cfg.teachers[0],
            [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": f"{tag} step {i}: " + "context " * 200},
            ],
            tools,
        )
        for i in range(n)
    ]


def bare_worker(a: dict) -> None:
    """Baseline run: the same bodies through a bare httpx.AsyncClient (no ledger, cache or parsing)."""
    import asyncio

    import httpx
    import orjson

    from composer_pipeline.teachers.config import parse_teachers

    reqs = _requests(parse_teachers(_teachers(a["url"], a["c"])), a["n"], a["run"])
    Path(f"{a['start']}.{a['run']}").touch()
    while not os.path.exists(a["start"]):
        time.sleep(0.005)

    async def go() -> None:
        sem = asyncio.Semaphore(a["c"])
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=a["c"]), timeout=60) as client:

            async def one(r):
                async with sem:
                    (await client.post(a["url"] + "/chat/completions", content=orjson.dumps(r.body))).json()

            await asyncio.gather(*(one(r) for r in reqs))

    asyncio.run(go())
    print(json.dumps({"end": time.time()}), flush=True)


def worker(a: dict) -> None:
    """One replay run (a subprocess of the throughput bench)."""
    if a.get("bare"):
        return bare_worker(a)
    from composer_pipeline.ledger import Ledger
    from composer_pipeline.replay.run import replay_requests
    from composer_pipeline.teachers.cache import ResponseCache
    from composer_pipeline.teachers.config import parse_teachers

    cfg = parse_teachers(_teachers(a["url"], a["c"]))
    reqs = _requests(cfg, a["n"], a["run"])
    ledger, cache = Ledger(a["ledger"]), ResponseCache(a["cache"])
    Path(f"{a['start']}.{a['run']}").touch()
    while not os.path.exists(a["start"]):
        time.sleep(0.005)
    res = replay_requests(reqs, cfg, {}, cache=cache, ledger=ledger, run_id=a["run"])
    assert res.summary["answered"] == a["n"], res.summary
    print(json.dumps({"end": time.time()}), flush=True)


def start_server(latency: float) -> tuple[subprocess.Popen, str]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the test helpers live in the checkout
    from tests.support.scripted_server import start_subprocess

    return start_subprocess(latency)


def fresh_ledger(backend: str, pg: str | None, d: Path) -> str:
    if backend == "sqlite":
        return str(d / f"ledger-{uuid.uuid4().hex[:8]}.sqlite")
    import psycopg2

    name = f"bench_{uuid.uuid4().hex[:10]}"
    con = psycopg2.connect(pg)
    con.autocommit = True
    con.cursor().execute(f"CREATE DATABASE {name}")
    con.close()
    return pg.rsplit("/", 1)[0] + "/" + name


def overhead(ledger_url: str, n: int) -> dict:
    from composer_pipeline.ledger import Ledger, Reserve

    led = Ledger(ledger_url)
    led.start_run("o", 30)
    record = {
        "teacher": "t",
        "model": "m",
        "response": {"choices": [{"message": {"role": "assistant", "content": "x" * 400}}]},
        "cost_usd": 1e-5,
        "run_id": "o",
    }
    ms = []
    for i in range(n):
        cid = f"{i:064x}"
        t0 = time.perf_counter()
        assert led.claim(cid, "t", "o").state == "mine"
        r = led.try_reserve(Reserve("t", 1e6, "o", 1e6, 1e-4, cid))
        led.mark_sent(r.id)
        led.close(r.id, "settled", 1e-5, answer=(cid, record))
        ms.append(1000 * (time.perf_counter() - t0))
    ms.sort()
    return {
        "calls": n,
        "p50_ms": round(statistics.median(ms), 3),
        "p95_ms": round(ms[int(0.95 * (n - 1))], 3),
        "max_ms": round(ms[-1], 3),
    }


def throughput(ledger_url: str | None, k: int, c: int, latency: float, rounds: int, url: str, d: Path) -> dict:
    start = d / f"go-{uuid.uuid4().hex[:6]}"
    n = rounds * c
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--worker",
                json.dumps(
                    {
                        "url": url,
                        "c": c,
                        "n": n,
                        "run": f"r{j}-{start.name}",
                        "ledger": ledger_url,
                        "cache": str(d / f"cache-{start.name}-{j}"),
                        "start": str(start),
                        "bare": ledger_url is None,
                    }
                ),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for j in range(k)
    ]
    while not all(Path(f"{start}.r{j}-{start.name}").exists() for j in range(k)):
        time.sleep(0.01)
    t0 = time.time()
    start.touch()
    ends = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0
        ends.append(json.loads(out.strip().splitlines()[-1])["end"])
    wall = max(ends) - t0
    ideal = k * c / latency
    return {
        "runs": k,
        "C": c,
        "L_s": latency,
        "calls": k * n,
        "wall_s": round(wall, 3),
        "calls_per_s": round(k * n / wall, 2),
        "ideal_calls_per_s": round(ideal, 2),
        "ratio": round(k * n / wall / ideal, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--postgres", default=None, help="postgresql:// URL of a server to bench too")
    ap.add_argument("--runs", default="1,2,4,8")
    ap.add_argument("--c", type=int, default=8)
    ap.add_argument("--latency", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--overhead", type=int, default=500, help="calls timed for the per-call overhead (0 = skip)")
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    backends = ["sqlite"] + (["postgresql"] if args.postgres else [])
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for b in backends:
            if args.overhead:
                print(
                    json.dumps(
                        {"backend": b, "overhead_per_call": overhead(fresh_ledger(b, args.postgres, d), args.overhead)}
                    ),
                    flush=True,
                )
        proc, url = start_server(args.latency)
        try:
            # each K: bare httpx, then every backend, side by side
            for k in [int(x) for x in args.runs.split(",")]:
                bare = throughput(None, k, args.c, args.latency, args.rounds, url, d)
                print(json.dumps({"backend": "bare-httpx", **bare}), flush=True)
                for b in backends:
                    r = throughput(fresh_ledger(b, args.postgres, d), k, args.c, args.latency, args.rounds, url, d)
                    print(
                        json.dumps({"backend": b, **r, "vs_bare_httpx": round(r["ratio"] / bare["ratio"], 3)}),
                        flush=True,
                    )
        finally:
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    main()
