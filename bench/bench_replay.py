"""Replay client throughput against a local OpenAI-compatible server with a fixed artificial latency.

For each (concurrency C, latency L): start the scripted server (its own process, every answer delayed
by L seconds), replay N = rounds·C distinct requests through the real client path (reservation in the
DuckDB ledger, HTTP with connection reuse, settle, atomic cache write, parse), and report

* achieved calls/s and its ratio to the ideal C/L (target >= 0.9),
* client overhead per call = C·wall/N − L (seconds a concurrency slot spends per call beyond L),
* a no-latency run (L=0) whose calls/s bounds the client+server per-call cost,
* the same requests through a bare ``httpx.AsyncClient`` (no ledger/cache/parsing) as a baseline, so
  the cost of the machine and the server is separated from the cost of the replay client.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_replay.py [--configs 8:0.5,32:0.5,64:1.0] [--rounds 10]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from composer_pipeline.ledger import Ledger
from composer_pipeline.replay.requests import make_request
from composer_pipeline.replay.run import replay_requests
from composer_pipeline.teachers.cache import ResponseCache
from composer_pipeline.teachers.config import parse_teachers

# the test helpers (tests/support) live in the checkout
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.scripted_server import start_subprocess  # noqa: E402


def start_server(latency: float) -> tuple[subprocess.Popen, str]:
    return start_subprocess(latency)


def raw_httpx(url: str, c: int, reqs) -> float:
    """Baseline: the same bodies posted with a bare httpx.AsyncClient (no ledger, cache or parsing)."""
    import asyncio

    import httpx
    import orjson

    async def go() -> float:
        sem = asyncio.Semaphore(c)
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=c), timeout=30) as client:

            async def one(r):
                async with sem:
                    resp = await client.post(url + "/chat/completions", content=orjson.dumps(r.body))
                    resp.json()

            t0 = time.perf_counter()
            await asyncio.gather(*(one(r) for r in reqs))
            return time.perf_counter() - t0

    return asyncio.run(go())


def warm_up() -> None:
    """Import-time costs (httpx, duckdb and the pandas it loads) are paid once per process: not per call."""
    run_one(4, 0.0, 2, warm=True)


def run_one(c: int, latency: float, rounds: int, warm: bool = False) -> dict:
    proc, url = start_server(latency)
    try:
        cfg = parse_teachers(
            {
                "ceiling_usd": 1e6,
                "teachers": [
                    dict(
                        name="bench",
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
        )
        n = rounds * c
        tools = [
            {
                "type": "function",
                "function": {
                    "name": "Read",
                    "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}}},
                },
            }
        ]
        reqs = [
            make_request(
                f"s{i}",
                "bench",
                cfg.teachers[0],
                [
                    {"role": "system", "content": "You are a coding agent."},
                    {"role": "user", "content": f"step {i}: " + "context " * 200},
                ],
                tools,
            )
            for i in range(n)
        ]
        with tempfile.TemporaryDirectory() as d:
            ledger, cache = Ledger(Path(d) / "ledger.sqlite"), ResponseCache(Path(d) / "cache")
            t0 = time.perf_counter()
            res = replay_requests(reqs, cfg, {}, cache=cache, ledger=ledger, run_id="bench")
            wall = time.perf_counter() - t0
        s = res.summary
        assert s["answered"] == n, s
        raw_wall = raw_httpx(url, c, reqs) if not warm else wall
        out = {"C": c, "L_s": latency, "calls": n, "wall_s": round(wall, 3), "calls_per_s": round(n / wall, 2)}
        if latency > 0:
            ideal = c / latency
            out |= {
                "ideal_calls_per_s": round(ideal, 2),
                "ratio": round(n / wall / ideal, 3),
                "overhead_per_call_ms": round(1000 * (c * wall / n - latency), 1),
                "raw_httpx_ratio": round(n / raw_wall / ideal, 3),
                "overhead_vs_raw_httpx_ms": round(1000 * c * (wall - raw_wall) / n, 1),
            }
        else:
            out |= {"raw_httpx_calls_per_s": round(n / raw_wall, 2)}
        out |= {"latency_p50_s": s["latency_s_http"].get("p50"), "latency_p95_s": s["latency_s_http"].get("p95")}
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="8:0.5,32:0.5,64:1.0", help="C:L pairs")
    ap.add_argument("--rounds", type=int, default=10, help="calls per run = rounds x C")
    ap.add_argument("--no-zero-latency", action="store_true")
    args = ap.parse_args()
    configs = [(int(c), float(lat)) for c, lat in (x.split(":") for x in args.configs.split(","))]
    if not args.no_zero_latency:
        configs.append((8, 0.0))
    warm_up()
    for c, lat in configs:
        print(json.dumps(run_one(c, lat, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
