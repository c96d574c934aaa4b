"""`composer-pipeline replay` end to end on ingested sessions: the plan, the rows, a re-run that pays
nothing, and a run killed with SIGKILL halfway whose re-run never pays twice for an answer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
import yaml
from ledger_helpers import ledger_rows

from composer_pipeline.ledger import Ledger
from composer_pipeline.teachers.cache import ResponseCache

from .conftest import teacher_dict


def _yaml(tmp_path, url, **over) -> str:
    p = tmp_path / "teachers.yaml"
    teachers = [teacher_dict(url, "t1", **over), teacher_dict(url, "t2", model="scripted-b", **over)]
    p.write_text(yaml.safe_dump({"ceiling_usd": 5.0, "teachers": teachers}))
    return str(p)


def _cmd(samples_dir, teachers, out, home):
    return [
        sys.executable,
        "-m",
        "composer_pipeline",
        "replay",
        "--states",
        str(samples_dir),
        "--teachers",
        teachers,
        "--out",
        str(out),
        "--ledger",
        str(home / "ledger.sqlite"),
        "--cache",
        str(home / "cache"),
    ]


@pytest.mark.slow
def test_cli_replay_and_rerun(tmp_path, server, samples_dir, samples_tables):
    states, _ = samples_tables
    teachers = _yaml(tmp_path, server.url)
    env = {**os.environ, "COMPOSER_PIPELINE_HOME": str(tmp_path / "home")}
    p = subprocess.run(
        _cmd(samples_dir, teachers, tmp_path / "out1", tmp_path), capture_output=True, text=True, env=env, timeout=120
    )
    assert p.returncode == 0, p.stderr
    s1 = json.loads(p.stdout.strip().splitlines()[-1])
    rows = pq.read_table(tmp_path / "out1" / "replays.parquet").to_pylist()
    assert len(rows) == 2 * states.num_rows == s1["rows"] == s1["calls"]
    assert {r["status"] for r in rows} == {"answered"} and s1["total_spend"] > 0
    assert set(s1["spend_by_teacher"]) == {"t1", "t2"}
    plan = pq.read_table(tmp_path / "out1" / "cost_plan.parquet")
    assert plan.num_rows == len(rows) and set(plan.column("call_id").to_pylist()) == {r["call_id"] for r in rows}
    n = len(server.requests)
    p2 = subprocess.run(
        _cmd(samples_dir, teachers, tmp_path / "out2", tmp_path), capture_output=True, text=True, env=env, timeout=120
    )
    s2 = json.loads(p2.stdout.strip().splitlines()[-1])
    assert s2["calls"] == 0 and s2["cache_hits"] == len(rows) and s2["total_spend"] == 0
    assert len(server.requests) == n
    # what an answer cost stays in cost_usd across re-runs/backfills; paid_usd says what each run paid
    rows2 = {r["call_id"]: r for r in pq.read_table(tmp_path / "out2" / "replays.parquet").to_pylist()}
    assert all(r["paid_usd"] == r["cost_usd"] > 0 for r in rows)
    assert all(rows2[r["call_id"]]["cost_usd"] == r["cost_usd"] and rows2[r["call_id"]]["paid_usd"] == 0 for r in rows)
    from composer_pipeline.lineage import format_lineage

    r0 = next(iter(rows2.values()))
    chain = {
        "pair": {
            "pair_id": "p",
            "kind": "dpo",
            "tables": [],
            "n_agreeing": 2,
            "n_teachers": 2,
            "agreement_score": 1.0,
            "agreeing_teachers": ["t1", "t2"],
            "cost_usd": 0.0,
            "consensus_signature": "",
            "agent_signature": "",
        },
        "replays": [r0],
        "state": None,
        "session": {"session_key": "k", "session_id": "s", "source_file": "f"},
        "records": [],
        "missing": [],
    }
    line = next(x for x in format_lineage(chain).splitlines() if r0["call_id"][:16] in x)
    assert f"cost ${r0['cost_usd']:.6f}  paid $0.000000 (cache)" in line


def test_cli_errors_are_clear(tmp_path, server):
    teachers = _yaml(tmp_path, server.url)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "composer_pipeline",
            "replay",
            "--states",
            str(tmp_path / "empty"),
            "--teachers",
            teachers,
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "no trace_states" in p.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("ceiling_usd: 1\nteachers: [{name: a}]\n")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "composer_pipeline",
            "replay",
            "--states",
            str(tmp_path),
            "--teachers",
            str(bad),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "missing required key(s)" in p.stderr


# SIGKILL mid-run of a real CLI process (test_faults checks re-runs pay nothing, in-process)
@pytest.mark.slow
def test_kill_9_mid_run_then_rerun_never_pays_twice(tmp_path, server, samples_dir, samples_tables):
    states, _ = samples_tables
    server.latency_s = 0.25
    teachers = _yaml(tmp_path, server.url, max_concurrency=2)
    cache = ResponseCache(tmp_path / "cache")
    proc = subprocess.Popen(
        _cmd(samples_dir, teachers, tmp_path / "out1", tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while len(cache) < 6 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    cached = {p.stem for p in cache.dir.glob("*/*.json")}
    # every paid answer is in the ledger before the cache: some may have missed only the cache at the kill
    received = cached | {
        c["call_id"] for c in ledger_rows(Ledger(tmp_path / "ledger.sqlite"), "claims") if c["state"] == "answered"
    }
    assert 6 <= len(received) < 2 * states.num_rows, "kill landed too late to test anything"
    assert not (tmp_path / "out1" / "replays.parquet").exists()
    first_run_requests = len(server.requests)

    t0 = time.monotonic()
    p = subprocess.run(
        _cmd(samples_dir, teachers, tmp_path / "out2", tmp_path), capture_output=True, text=True, timeout=180
    )
    assert p.returncode == 0, p.stderr
    assert time.monotonic() - t0 < 25, "the re-run waited for the dead run's lease (its process is gone: it must not)"
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    rows = pq.read_table(tmp_path / "out2" / "replays.parquet").to_pylist()
    assert len(rows) == 2 * states.num_rows and {r["status"] for r in rows} == {"answered"}
    assert summary["cache_hits"] >= len(cached) and summary["cache_hits"] + summary["shared_answers"] >= len(received)
    # every answer received before the kill was requested exactly once in total
    _URLS[:] = [server.url]
    body_of = {}
    for req in server.requests:
        cid = next((r["call_id"] for r in rows if r["call_id"] in received and _matches(req.body, r, tmp_path)), None)
        if cid:
            body_of.setdefault(cid, []).append(req)
    assert set(body_of) == received and all(len(v) == 1 for v in body_of.values())
    # at most the requests in flight at the kill (concurrency 2 × 2 teachers) were sent again
    assert len(server.requests) - first_run_requests == len(rows) - len(received)
    assert len(server.requests) <= len(rows) + 4


# the scripted server's URL (call_id carries the endpoint)
_URLS: list[str] = []


def _matches(body: bytes, row: dict, tmp_path) -> bool:
    from composer_pipeline.teachers.cache import call_id

    data = json.loads(body)
    # added on the wire only (a hash of the stream): not part of call_id
    data.pop("prompt_cache_key", None)
    return any(call_id(row["teacher"], data["model"], data, url) == row["call_id"] for url in _URLS)
