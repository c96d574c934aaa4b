"""The money path under concurrency and faults, on every ledger backend: ≥4 replay processes against
the loopback scripted server, overlapping and disjoint states, a binding budget, kill -9 and SIGTERM at
random points, an auditor connection held open. What the server billed never exceeds what the ledger
counts nor the budget; every state × teacher ends answered; nothing is bought twice except calls in
flight at a kill; nothing stays reserved after reconcile."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from ledger_helpers import ledger_rows, reserve

from composer_pipeline.ledger import Ledger

from .conftest import make_config, scripted_request, teacher_dict

pytestmark = pytest.mark.slow  # multi-process races with kills

WORKER = Path(__file__).with_name("worker.py")


def _billed_usd(server) -> float:
    return sum(p * 1.0 / 1e6 + c * 2.0 / 1e6 for _, p, c in server.billed)  # teacher_dict prices


def _start(args: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def _result(p: subprocess.Popen, timeout: float = 120) -> tuple[int, dict]:
    out, err = p.communicate(timeout=timeout)
    lines = out.strip().splitlines()
    assert lines or p.returncode < 0, f"rc={p.returncode}: {err[-2000:]}"
    return p.returncode, (json.loads(lines[-1]) if lines else {})


def _go(start: Path, runs: list[str], timeout: float = 90) -> None:
    """Start every worker at once, after all of them have finished importing (2 cores: that takes seconds)."""
    deadline = time.monotonic() + timeout
    while not all(Path(f"{start}.{r}").exists() for r in runs):
        assert time.monotonic() < deadline, "workers never got ready"
        time.sleep(0.02)
    start.touch()


def _wait_registered(ledger: Ledger, run: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["run_id"] == run for r in ledger_rows(ledger, "runs")):
            return
        time.sleep(0.02)
    raise AssertionError(f"run {run} never registered")


def test_overlapping_runs_buy_each_request_once(tmp_path, server, ledger_url):
    server.latency_s = 0.05
    ledger = Ledger(ledger_url)
    audit = None
    # an auditor's read transaction held open for the whole test
    if "://" not in ledger_url:
        audit = sqlite3.connect(f"file:{ledger_url}?mode=ro", uri=True)
        audit.execute("BEGIN")
        audit.execute("SELECT COUNT(*) FROM reservations").fetchone()
    start = tmp_path / "go"
    procs = [
        _start(
            {
                "url": server.url,
                "ledger": ledger_url,
                "cache": str(tmp_path / f"cache{k}"),
                "run": f"p{k}",
                "states": list(range(12)),
                "teachers": 2,
                "start_file": str(start),
            }
        )
        for k in range(4)
    ]
    _go(start, [f"p{k}" for k in range(4)])
    results = [_result(p) for p in procs]
    assert all(rc == 0 for rc, _ in results), results
    if audit is not None:
        audit.close()
    counts = Counter(r.body_hash for r in server.requests)
    assert len(counts) == 24 and set(counts.values()) == {1}, "a request was bought twice"
    paid = 0.0
    for _, res in results:
        rows = res["rows"]
        assert len(rows) == 24 and {r["status"] for r in rows} == {"answered"}
        paid += sum(r["paid_usd"] for r in rows)
    assert (
        sum(res["summary"]["shared_answers"] for _, res in results)
        + sum(res["summary"]["http_requests"] for _, res in results)
        == 4 * 24
    )
    billed = _billed_usd(server)
    assert paid == pytest.approx(billed) and ledger.spent("t1") + ledger.spent("t2") == pytest.approx(billed)
    assert ledger.open_reservations() == 0 and {r["state"] for r in ledger_rows(ledger, "runs")} == {"closed"}


def test_binding_budget_is_shared_and_fully_used(tmp_path, server, ledger_url):
    # runs last longer than the start-up skew of 4 processes on 2 cores
    server.latency_s = 0.2
    worst = scripted_request(make_config(server.url), 0, pad=3).worst_case_usd
    # about 28 of the 60 calls at their actual cost
    budget = 8 * worst
    start = tmp_path / "go"
    procs = [
        _start(
            {
                "url": server.url,
                "ledger": ledger_url,
                "cache": str(tmp_path / f"cache{k}"),
                "run": f"b{k}",
                "states": list(range(15)),
                "pad": k,
                "budget_usd": budget,
                "start_file": str(start),
            }
        )
        for k in range(4)
    ]
    _go(start, [f"b{k}" for k in range(4)])
    results = [_result(p) for p in procs]
    assert all(rc == 0 for rc, _ in results), results
    ledger = Ledger(ledger_url)
    billed = _billed_usd(server)
    assert billed <= budget + 1e-12 and ledger.spent("t1") == pytest.approx(billed)
    answered = [res["summary"]["answered"] for _, res in results]
    exhausted = sum(res["summary"]["budget_exhausted"] for _, res in results)
    assert all(n >= 1 for n in answered), (
        f"a run was starved: {answered} {[Counter(r['reason'] for r in res['rows']) for _, res in results]}"
    )
    assert exhausted > 0 and sum(answered) + exhausted == 60
    # refused only when settled spend truly left no room for one more worst case
    assert budget - ledger.spent("t1") < 1.1 * worst
    assert ledger.open_reservations() == 0 and ledger_rows(ledger, "waiters") == []


def test_kill_9_and_sigterm_at_random_points(tmp_path, server, ledger_url):
    seed = random.randrange(10**6)
    rnd = random.Random(seed)
    server.latency_s = 0.15
    ledger = Ledger(ledger_url)
    common = {"url": server.url, "ledger": ledger_url, "states": list(range(20)), "teachers": 2, "lease_s": 1.0}
    procs = {k: _start({**common, "cache": str(tmp_path / f"cache{k}"), "run": f"k{k}"}) for k in range(4)}
    for k in (0, 1):
        _wait_registered(ledger, f"k{k}")
    time.sleep(rnd.uniform(0.05, 0.6))
    procs[0].kill()
    time.sleep(rnd.uniform(0.0, 0.3))
    procs[1].send_signal(signal.SIGTERM)
    rc0, _ = _result(procs[0])
    rc1, r1 = _result(procs[1])
    assert rc0 == -signal.SIGKILL, f"seed {seed}"
    assert rc1 in (0, 128 + signal.SIGTERM, -signal.SIGTERM), f"seed {seed}: {rc1}"  # -15: it had finished already
    survivors = [_result(procs[k]) for k in (2, 3)]
    for rc, res in survivors:
        assert rc == 0 and len(res["rows"]) == 40 and {r["status"] for r in res["rows"]} == {"answered"}, (
            f"seed {seed}: {[r['reason'] for r in res['rows'] if r['status'] != 'answered']}"
        )
    runs = {r["run_id"]: r["state"] for r in ledger_rows(ledger, "runs")}
    assert runs["k1"] == "closed", f"seed {seed}: SIGTERM must close the run"
    time.sleep(1.2)
    ledger.reconcile()
    assert ledger.open_reservations() == 0 and "live" not in {r["state"] for r in ledger_rows(ledger, "runs")}
    # bought twice only if in flight at the kill / SIGTERM (≤ 2 teachers × 4 concurrency each)
    counts = Counter(r.body_hash for r in server.requests)
    assert len(counts) == 40 and sum(n - 1 for n in counts.values()) <= 16, f"seed {seed}: {counts}"
    assert _billed_usd(server) <= ledger.spent("t1") + ledger.spent("t2") + 1e-12  # nothing billed is uncounted
    kept = [r for r in ledger_rows(ledger) if r["state"] == "kept"]
    assert all(("lease expired" in r["note"]) or ("interrupted" in r["note"]) for r in kept), kept


def test_cli_budget_and_reconcile(tmp_path, ledger_url, server):
    import yaml

    teachers = tmp_path / "t.yaml"
    teachers.write_text(
        yaml.safe_dump({"ceiling_usd": 1.0, "teachers": [{**teacher_dict(server.url), "budget_usd": 1.0}]})
    )
    led = Ledger(ledger_url)
    led.start_run("gone", lease_s=0.2)
    r = reserve(led, "t1", 0.25, budget_usd=1.0, run_id="gone", ceiling_usd=1.0)
    led.mark_sent(r.id)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "composer_pipeline",
            "teachers",
            "budget",
            "--teachers",
            str(teachers),
            "--ledger",
            ledger_url,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert (
        row["teacher"] == "t1"
        and row["reserved_usd"] == pytest.approx(0.25)
        and row["remaining_usd"] == pytest.approx(0.75)
    )
    assert {"budget_usd", "spent_usd", "kept_calls"} <= set(row)
    time.sleep(0.3)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "composer_pipeline",
            "teachers",
            "reconcile",
            "--teachers",
            str(teachers),
            "--ledger",
            ledger_url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.strip().splitlines()]
    assert lines[0]["reconciled"]["expired_runs"] == ["gone"] and lines[0]["open_reservations"] == 0
    assert (
        lines[1]["reserved_usd"] == 0 and lines[1]["kept_calls"] == 1 and lines[1]["spent_usd"] == pytest.approx(0.25)
    )
