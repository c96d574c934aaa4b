"""A shared PostgreSQL ledger restarted or stopped under two concurrent `composer-pipeline replay`
processes (real CLI, real server on loopback, a real loopback teacher): both ride through, a signal
during the outage exits cleanly with the run closed, a server down past ``ledger_outage_s`` stops the
run with a clear error, and the next replay finalizes what that run left. Nothing is bought twice and
nothing stays reserved."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from ledger_helpers import ledger_rows

from composer_pipeline.ledger import Ledger

from .conftest import teacher_dict


@pytest.fixture
def pg():
    from postgres_server import PostgresServer

    srv = PostgresServer().start()
    yield srv
    srv.stop()


def _yaml(tmp_path: Path, url: str, name: str = "teachers.yaml", **top) -> str:
    p = tmp_path / name
    teachers = [
        teacher_dict(url, "t1", max_concurrency=2, timeout_s=20.0),
        teacher_dict(url, "t2", model="scripted-b", max_concurrency=2, timeout_s=20.0),
    ]
    p.write_text(yaml.safe_dump({"ceiling_usd": 5.0, "teachers": teachers, **top}))
    return str(p)


def _replay(samples_dir, teachers: str, out: Path, ledger: str, cache: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
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
            ledger,
            "--cache",
            str(cache),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def _wait_requests(server, n: int, procs, url: str, timeout: float = 90) -> None:
    """Until every replay has registered its run (so all are past opening the ledger) and ``n`` requests went out."""
    deadline = time.monotonic() + timeout
    ledger = Ledger(url)
    while len(server.requests) < n or len(
        {r["pid"] for r in ledger_rows(ledger, "runs")} & {p.pid for p in procs}
    ) < len(procs):
        assert time.monotonic() < deadline, "the replays never got going"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.01)
    ledger.disconnect()


def _finish(p: subprocess.Popen, timeout: float = 150) -> tuple[int, str, str]:
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"replay hung (no exit in {timeout}s): {err[-3000:]}")
    return p.returncode, out, err


def _bought_twice(server) -> int:
    return sum(
        n - 1 for n in Counter(r.body_hash for r in server.requests if r.behaviour == "answer").values() if n > 1
    )


def _settled_usd(ledger: Ledger) -> float:
    return sum(r["cost_usd"] or 0.0 for r in ledger_rows(ledger, "reservations") if r["state"] == "settled")


def _billed_usd(server) -> float:
    return sum(p * 1.0 / 1e6 + c * 2.0 / 1e6 for _, p, c in server.billed)  # teacher_dict prices


@pytest.mark.slow
@pytest.mark.parametrize("outage", ["restart", "stop_start", "stop_longer_than_lease"])
def test_two_replays_ride_through_a_postgres_outage(outage, tmp_path, pg, server, samples_dir, samples_tables):
    states, _ = samples_tables
    server.latency_s = 0.3
    url = pg.create_database("ledger")
    # a stop longer than the runs' lease: no run could heartbeat, so none may be finalized for it
    teachers = _yaml(tmp_path, server.url, **({"lease_s": 2} if outage == "stop_longer_than_lease" else {}))
    # shared: the second run waits on the first's claims (the waits that hung)
    cache = tmp_path / "cache"
    procs = [_replay(samples_dir, teachers, tmp_path / f"out{i}", url, cache) for i in (1, 2)]
    _wait_requests(server, 8, procs, url)
    t0 = time.monotonic()
    if outage == "restart":
        pg.restart()
    else:
        pg.halt()
        time.sleep(3.0 if outage == "stop_start" else 5.0)
        pg.resume()
    outage_s = time.monotonic() - t0
    results = [_finish(p) for p in procs]
    for rc, out, err in results:
        assert rc == 0, err[-3000:]
        assert "Traceback" not in err
    for i in (1, 2):
        rows = pq.read_table(tmp_path / f"out{i}" / "replays.parquet").to_pylist()
        assert len(rows) == 2 * states.num_rows and {r["status"] for r in rows} == {"answered"}, Counter(
            r["reason"] for r in rows
        )
    # every distinct request bought once: the calls in flight at the outage settled once the server was back
    assert len({r.body_hash for r in server.requests}) == 2 * states.num_rows
    assert _bought_twice(server) == 0, f"bought twice after a {outage_s:.1f}s {outage}"
    ledger = Ledger(url)
    assert ledger.open_reservations() == 0
    assert {r["state"] for r in ledger_rows(ledger, "runs")} == {"closed"}
    assert ledger_rows(ledger, "waiters") == []
    assert abs(_settled_usd(ledger) - _billed_usd(server)) < 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_during_outage_closes_run_and_deadline_stops_cleanly(
    sig, tmp_path, pg, server, samples_dir, samples_tables
):
    """While the server is stopped: SIGTERM/SIGINT to one run exits 143/130 once the run could be closed (no traceback);
    the other run, with ``ledger_outage_s: 4``, stops buying when the server stays down: holding nothing, it
    exits with a clear error; holding answers paid during the outage (when it had requests of its own in
    flight), it waits for the server and records them (issue 30). After the server is back the next replay
    finalizes what is left and buys only what was never answered."""
    states, _ = samples_tables
    server.latency_s = 0.3
    url = pg.create_database("ledger")
    teachers = _yaml(tmp_path, server.url)
    p1 = _replay(samples_dir, teachers, tmp_path / "out1", url, tmp_path / "cache1")
    p2 = _replay(
        samples_dir,
        _yaml(tmp_path, server.url, "short.yaml", ledger_outage_s=4),
        tmp_path / "out2",
        url,
        tmp_path / "cache2",
    )
    _wait_requests(server, 8, [p1, p2], url)
    pg.halt()
    p1.send_signal(sig)
    time.sleep(1.0)
    assert p1.poll() is None, "exited without closing its ledger run"
    # the server stays down longer than p2's ledger_outage_s
    deadline = time.monotonic() + 60
    while p2.poll() is None and not list((tmp_path / "cache2" / "unrecorded").glob("*.pending")):
        assert time.monotonic() < deadline, "p2 neither stopped nor held its answers"
        time.sleep(0.05)
    held = p2.poll() is None
    # waits for the ledger: its deadline passed (its other calls fail), the answers it holds wait
    if held:
        time.sleep(1.0)
        assert p2.poll() is None, "exited holding paid answers"
    else:
        rc2, _, err2 = _finish(p2, timeout=5)
        assert rc2 == 2, err2[-3000:]
        assert "Traceback" not in err2 and "unreachable for 4s" in err2, err2[-3000:]
    pg.resume()
    if held:
        rc2, _, err2 = _finish(p2, timeout=60)
        assert rc2 == 0 and "waiting for it to record" in err2 and "Traceback" not in err2, err2[-3000:]
        assert not list((tmp_path / "cache2" / "unrecorded").glob("*.pending"))  # recorded
    rc1, _, err1 = _finish(p1, timeout=60)
    assert rc1 == 128 + sig and "Traceback" not in err1 and f"interrupted by {sig.name}" in err1, err1[-3000:]
    ledger = Ledger(url)
    runs = {r["pid"]: r["state"] for r in ledger_rows(ledger, "runs")}
    # p2 closed its run once the server was back; or, gone during the outage, it could not
    assert runs[p1.pid] == "closed" and runs[p2.pid] == ("closed" if held else "live")
    n = len(server.requests)
    answered = {c["call_id"] for c in ledger_rows(ledger, "claims") if c["state"] == "answered"}

    p3 = _replay(samples_dir, teachers, tmp_path / "out3", url, tmp_path / "cache3")
    rc3, out3, err3 = _finish(p3)
    assert rc3 == 0, err3[-3000:]
    s3 = json.loads(out3.strip().splitlines()[-1])
    assert s3["shared_answers"] == len(
        answered & {r["call_id"] for r in pq.read_table(tmp_path / "out3" / "replays.parquet").to_pylist()}
    )
    assert len(server.requests) - n == 2 * states.num_rows - s3["shared_answers"]  # only what was never answered
    assert {r["state"] for r in ledger_rows(ledger, "runs")} == ({"closed"} if held else {"closed", "expired"})
    assert ledger.open_reservations() == 0


def test_a_server_restart_expires_no_lease(pg):
    """While the server was down no run could heartbeat: right after a restart a lease is judged from the
    server's start, so a live run whose last beat is older than its lease is not finalized (its claims not
    handed to another run to buy again). A run that stays silent for a whole lease after it is."""
    url = pg.create_database("ledger")
    ledger = Ledger(url)
    ledger.start_run("quiet", 30.0)
    assert ledger.claim("c" * 64, "t1", "quiet").state == "mine"
    ledger._tx(
        lambda c: c.execute("UPDATE runs SET heartbeat_at = heartbeat_at - 60, lease_s = 30 WHERE run_id = 'quiet'")
    )
    pg.restart()
    assert ledger.claims_status(["c" * 64]) == {"c" * 64: "inflight"}
    assert ledger.reconcile()["expired_runs"] == []
    assert ledger.claim("c" * 64, "t1", "other").state == "wait"
    ledger._tx(lambda c: c.execute("UPDATE runs SET lease_s = 0.5 WHERE run_id = 'quiet'"))
    time.sleep(1.0)
    assert ledger.reconcile()["expired_runs"] == ["quiet"]


@pytest.mark.slow
def test_answers_paid_while_the_ledger_is_down_reach_every_run(tmp_path, pg, server):
    """Four answers arrive while the PostgreSQL ledger is stopped, longer than the run's ``ledger_outage_s``:
    the run holds them (in the spool beside its response cache), waits for the ledger and records them once
    it is back, so a run on another machine (another response cache) buys none of them again. Before issue 30
    they were kept only in the receiving run's cache, and that run bought all four again."""
    from .test_concurrency import _result, _start

    url = pg.create_database("ledger")
    states = [0, 1, 2, 3]
    common = {"url": server.url, "ledger": url, "states": states, "max_concurrency": 4, "script": "hang:3"}
    first = _start({**common, "cache": str(tmp_path / "cache1"), "run": "first", "ledger_outage_s": 1.0})
    deadline = time.monotonic() + 90
    # all four sent; their answers come 3 s later
    while len(server.requests) < len(states):
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()
        time.sleep(0.01)
    pg.halt()
    # the answers arrive, their settles ride the outage for 1 s, then are held
    deadline = time.monotonic() + 30
    while len(list((tmp_path / "cache1" / "unrecorded").glob("*.pending"))) < len(states):
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()
        time.sleep(0.05)
    time.sleep(1.0)
    assert first.poll() is None  # waiting for the ledger, not gone
    pg.resume()
    rc, res = _result(first)
    assert rc == 0 and res["summary"]["answered"] == len(states), res
    assert not list((tmp_path / "cache1" / "unrecorded").glob("*.pending"))
    ledger = Ledger(url)
    assert ledger.open_reservations() == 0 and abs(_settled_usd(ledger) - _billed_usd(server)) < 1e-9
    rc, res = _result(_start({**common, "cache": str(tmp_path / "cache2"), "run": "second"}))
    assert rc == 0 and res["summary"]["answered"] == len(states) and res["summary"]["http_requests"] == 0
    assert len(server.requests) == len(states) == len({r.body_hash for r in server.requests})  # each bought once
