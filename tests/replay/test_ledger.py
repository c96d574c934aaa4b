"""The transactional ledger's API on every backend (``ledger_url``: SQLite file, and PostgreSQL when a
server fixture is available): reserve/settle/keep/release count as documented, a reservation waits for
money in flight instead of failing, claims make one buyer per request, expired leases are finalized
(never-sent → released, sent → kept), schema migrations are versioned, and an auditor's connection held
open blocks nothing."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from ledger_helpers import ledger_rows, reserve, schema_version, spend_by_run

from composer_pipeline.ledger import MIGRATIONS, Ledger, Reserve, redact_url


def test_reserve_settle_keep_release(ledger_url):
    led = Ledger(ledger_url)
    a = reserve(led, "t", 0.4, budget_usd=1.0, run_id="r1", ceiling_usd=10.0, call_id="c1")
    b = reserve(led, "t", 0.4, budget_usd=1.0, run_id="r1", ceiling_usd=10.0, call_id="c2")
    assert a.ok and b.ok and led.spent("t") == pytest.approx(0.8)
    c = reserve(led, "t", 0.4, budget_usd=1.0, run_id="r1", ceiling_usd=10.0)
    # held by calls in flight: would wait, not refused
    assert not c.ok and c.wait and "teacher budget" in c.reason
    # actual usage: frees the rest of the reservation
    led.close(a.id, "settled", 0.05)
    led.close(b.id, "released")  # never billed
    assert led.spent("t") == pytest.approx(0.05)
    d = reserve(led, "t", 0.4, budget_usd=1.0, run_id="r2", ceiling_usd=0.3)
    assert not d.ok and not d.wait and "run ceiling" in d.reason  # cannot fit even with nothing in flight
    e = reserve(led, "t", 0.2, budget_usd=1.0, run_id="r2", ceiling_usd=0.3)
    # may have been billed: counted at worst case
    led.close(e.id, "kept", note="timeout: outcome unknown")
    assert led.spent("t") == pytest.approx(0.25)
    f = reserve(led, "t", 0.8, budget_usd=1.0, run_id="r3", ceiling_usd=10.0)
    # 0.25 settled+kept + 0.8 > 1.0: truly exhausted
    assert not f.ok and not f.wait and "teacher budget" in f.reason
    assert spend_by_run(led, "r1") == {"t": pytest.approx(0.05)} and spend_by_run(led, "r2") == {
        "t": pytest.approx(0.2)
    }
    again = Ledger(ledger_url)  # another day, another process
    assert again.balance("t", 1.0).remaining_usd == pytest.approx(0.75) and again.spent("other") == 0
    bal = again.balance("t", 1.0)
    assert (bal.settled_usd, bal.kept_usd, bal.reserved_usd, bal.kept_calls) == (
        pytest.approx(0.05),
        pytest.approx(0.2),
        0.0,
        1,
    )
    assert sorted(r["state"] for r in ledger_rows(again)) == ["kept", "released", "settled"]
    assert schema_version(again) == MIGRATIONS[-1][0]


def test_reservation_waits_for_money_in_flight(ledger_url):
    led = Ledger(ledger_url)
    a = reserve(led, "t", 0.7, budget_usd=1.0, run_id="r1", ceiling_usd=10.0)
    threading.Timer(0.3, led.close, args=(a.id, "settled", 0.1)).start()
    t0 = time.monotonic()
    b = reserve(Ledger(ledger_url), "t", 0.7, budget_usd=1.0, run_id="r2", ceiling_usd=10.0, wait_s=10)
    assert b.ok and 0.25 < time.monotonic() - t0 < 5  # granted once the first call settled
    assert led.spent("t") == pytest.approx(0.8) and ledger_rows(led, "waiters") == []


def test_waiters_are_served_first_come_first_served(ledger_url):
    led = Ledger(ledger_url)
    held = reserve(led, "t", 0.9, budget_usd=1.0, run_id="r0", ceiling_usd=10.0)
    big = led.try_reserve(Reserve("t", 1.0, "r1", 10.0, 0.8), waiter_id="w-big")
    assert big.wait
    small = led.try_reserve(Reserve("t", 1.0, "r2", 10.0, 0.05), waiter_id="w-small")
    # 0.05 would fit beside 0.9, but the earlier waiter of 0.8 goes first: nobody starves
    assert small.wait
    led.close(held.id, "released")
    assert led.try_reserve(Reserve("t", 1.0, "r1", 10.0, 0.8), waiter_id="w-big").ok
    assert led.try_reserve(Reserve("t", 1.0, "r2", 10.0, 0.05), waiter_id="w-small").ok


def test_claims_one_buyer_and_the_answer_in_the_ledger(ledger_url):
    a, b = Ledger(ledger_url), Ledger(ledger_url)
    a.start_run("ra", lease_s=30)
    b.start_run("rb", lease_s=30)
    assert a.claim("c" * 64, "t", "ra").state == "mine"
    got = b.claim("c" * 64, "t", "rb")
    assert got.state == "wait" and got.owner == "ra"
    res = reserve(a, "t", 0.1, budget_usd=1.0, run_id="ra", ceiling_usd=1.0, call_id="c" * 64)
    a.mark_sent(res.id)
    record = {"teacher": "t", "model": "m", "response": {"choices": []}, "cost_usd": 0.01, "run_id": "ra"}
    a.close(res.id, "settled", 0.01, answer=("c" * 64, record))  # settle + answer: one transaction
    got = b.claim("c" * 64, "t", "rb")
    assert got.state == "answered" and got.record["cost_usd"] == 0.01 and b.answer("c" * 64) == got.record
    # a failed claim is taken over by the next run that needs it
    assert a.claim("d" * 64, "t", "ra").state == "mine"
    a.fail_claim("d" * 64, "ra", "http_400: bad request")
    assert b.claim("d" * 64, "t", "rb").state == "mine"


def test_expired_lease_is_finalized(ledger_url):
    led = Ledger(ledger_url)
    led.start_run("dead", lease_s=0.3)
    never_sent = reserve(led, "t", 0.2, budget_usd=1.0, run_id="dead", ceiling_usd=1.0)
    sent = reserve(led, "t", 0.3, budget_usd=1.0, run_id="dead", ceiling_usd=1.0, call_id="e" * 64)
    led.mark_sent(sent.id)
    assert led.claim("e" * 64, "t", "dead").state == "mine"
    assert led.spent("t") == pytest.approx(0.5)
    other = Ledger(ledger_url)
    other.start_run("alive", lease_s=30)
    assert other.claim("e" * 64, "t", "alive").state == "wait"  # the claimant's lease still runs
    assert other.reconcile()["expired_runs"] == []
    time.sleep(0.45)
    done = other.reconcile()
    assert done == {"expired_runs": ["dead"], "released": 1, "kept": 1, "claims_dropped": 1}
    rows = {r["id"]: r for r in ledger_rows(other)}
    assert rows[never_sent.id]["state"] == "released" and rows[sent.id]["state"] == "kept"
    assert "lease expired" in rows[sent.id]["note"] and rows[sent.id]["cost_usd"] == pytest.approx(0.3)
    bal = other.balance("t", 1.0)
    assert bal.spent_usd == pytest.approx(0.3) and bal.reserved_usd == 0 and bal.kept_calls == 1
    # the dead claimant's request may be bought again
    assert other.claim("e" * 64, "t", "alive").state == "mine"
    assert other.open_reservations() == 0 and not led.heartbeat("dead")


def test_close_run_releases_unsent_and_keeps_sent(ledger_url):
    led = Ledger(ledger_url)
    led.start_run("r", lease_s=30)
    a = reserve(led, "t", 0.1, budget_usd=1.0, run_id="r", ceiling_usd=1.0)
    b = reserve(led, "t", 0.1, budget_usd=1.0, run_id="r", ceiling_usd=1.0)
    led.mark_sent(b.id)
    assert led.close_run("r", "run interrupted") == {"released": 1, "kept": 1, "claims_dropped": 0}
    assert {r["id"]: r["state"] for r in ledger_rows(led)} == {a.id: "released", b.id: "kept"}
    assert led.spent("t") == pytest.approx(0.1)
    # a late close of a finalized reservation changes nothing...
    assert not led.close(b.id, "kept")
    assert led.spent("t") == pytest.approx(0.1)
    # ...but a late answer was billed: it is settled at its actual cost (a run paused past its lease, issue 30)
    assert led.close(b.id, "settled", 0.01)
    assert led.spent("t") == pytest.approx(0.01) and led.balance("t", 1.0).kept_calls == 0
    assert not led.close(b.id, "settled", 0.01)  # once


def test_auditor_connection_held_open_blocks_no_writer(tmp_path):
    path = tmp_path / "ledger.sqlite"
    led = Ledger(path)
    reserve(led, "t", 0.1, budget_usd=1.0, run_id="r", ceiling_usd=1.0)
    audit = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    audit.execute("BEGIN")
    assert audit.execute("SELECT COUNT(*) FROM reservations").fetchone() == (1,)  # read transaction held open
    t0 = time.monotonic()
    for _ in range(20):
        reserve(led, "t", 0.01, budget_usd=1.0, run_id="r", ceiling_usd=1.0)
    assert time.monotonic() - t0 < 5 and Ledger(path).open_reservations() == 21
    audit.close()


def test_bad_urls_are_clear(tmp_path):
    from composer_pipeline.ledger import LedgerError

    (tmp_path / "file").write_text("x")
    with pytest.raises(LedgerError, match="cannot create its directory"):
        Ledger(tmp_path / "file" / "ledger.sqlite")
    with pytest.raises(LedgerError, match=r"postgresql://u:\*\*\*@127.0.0.1:1/db: cannot connect"):
        Ledger("postgresql://u:secret@127.0.0.1:1/db")
    assert redact_url("postgresql://u:secret@h:5/db") == "postgresql://u:***@h:5/db"


def test_an_earlier_duckdb_ledger_is_imported_once(tmp_path):
    """Upgrading never resets a budget: the DuckDB ledger of earlier versions beside the new file is read once."""
    import duckdb

    from composer_pipeline.ledger import LedgerError

    old = duckdb.connect(str(tmp_path / "ledger.duckdb"))
    old.execute(
        "CREATE TABLE reservations (id VARCHAR PRIMARY KEY, teacher VARCHAR NOT NULL, run_id VARCHAR NOT NULL, "
        "call_id VARCHAR, state VARCHAR NOT NULL, reserved_usd DOUBLE NOT NULL, cost_usd DOUBLE, note VARCHAR, "
        "created_at TIMESTAMP NOT NULL, closed_at TIMESTAMP)"
    )
    old.executemany(
        "INSERT INTO reservations VALUES (?, ?, ?, ?, ?, ?, ?, ?, now(), NULL)",
        [
            ("a", "t", "r1", "c1", "settled", 0.4, 0.1, None),
            ("b", "t", "r1", "c2", "kept", 0.2, 0.2, "timeout"),
            ("c", "t", "r1", "c3", "released", 0.3, 0.0, None),
            ("d", "t", "r2", None, "reserved", 0.25, None, "credit"),
        ],
    )
    old.close()
    with pytest.raises(LedgerError, match="DuckDB ledger of an earlier version"):
        Ledger(tmp_path / "ledger.duckdb")
    led = Ledger(tmp_path / "ledger.sqlite")
    bal = led.balance("t", 1.0)
    assert (
        bal.spent_usd == pytest.approx(0.55)
        and bal.settled_usd == pytest.approx(0.1)
        and bal.kept_usd == pytest.approx(0.45)
    )
    assert bal.reserved_usd == 0 and bal.kept_calls == 1
    assert Ledger(tmp_path / "ledger.sqlite").spent("t") == pytest.approx(0.55)  # imported once, not on every open


def test_writes_survive_other_processes_closing_while_this_one_opens_more_connections(tmp_path):
    """Regression (lost writes under concurrent Dagster runs): a process with a live connection opens
    another one (a second Ledger, as each asset and check does); another process then opens the ledger
    and closes its last connection. That process must not conclude it was the last user and delete the
    WAL: every later write of the first process stays visible to everyone. (An ``open()``/``close()`` of
    the database file in the first process used to drop its POSIX locks and lose those writes.)"""
    import subprocess
    import sys

    path = tmp_path / "ledger.sqlite"
    led = Ledger(path)
    led.start_run("r1", lease_s=600)
    # a second connection in the same process
    ledger_rows(Ledger(path), "runs")
    tests = str(Path(__file__).resolve().parents[1])  # tests/ledger_helpers.py
    other = (
        "import sys; sys.path.insert(0, sys.argv[2]); from ledger_helpers import ledger_rows; "
        "from composer_pipeline.ledger import Ledger; l = Ledger(sys.argv[1]); "
        "print(len(ledger_rows(l, 'runs'))); l.disconnect()"
    )
    # another process comes and goes, closing its last connection
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", other, str(path), tests], capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == "1"
    led.claim("c1", "t", "r1")
    led.fail_claim("c1", "r1", "no answer")
    led.close_run("r1")
    check = (
        "import sys, json; sys.path.insert(0, sys.argv[2]); from ledger_helpers import ledger_rows; "
        "from composer_pipeline.ledger import Ledger; l = Ledger(sys.argv[1]); "
        "print(json.dumps([[r['run_id'], r['state']] for r in ledger_rows(l, 'runs')] + [[c['call_id'], c['state']] for c in ledger_rows(l, 'claims')]))"
    )
    out = subprocess.run([sys.executable, "-c", check, str(path), tests], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [["r1", "closed"], ["c1", "failed"]]
    # the WAL this process writes to was never deleted under it
    assert (tmp_path / "ledger.sqlite-wal").exists()


def test_connections_are_closed_by_disconnect(tmp_path):
    led = Ledger(tmp_path / "ledger.sqlite")
    assert schema_version(led) >= 1
    led.disconnect()
    led.disconnect()  # idempotent
    assert schema_version(led) >= 1  # reconnects on demand


def test_a_deleted_wal_fails_loudly_instead_of_losing_writes(tmp_path):
    """If the WAL is deleted under a live connection anyway (e.g. a tool in this process opened and
    closed the file), the next write raises instead of spending against a ledger nobody else can read."""
    import os

    from composer_pipeline.ledger import LedgerError

    path = tmp_path / "ledger.sqlite"
    led = Ledger(path)
    led.start_run("r1")
    os.unlink(f"{path}-wal")
    with pytest.raises(LedgerError, match="write-ahead log was deleted or replaced"):
        led.heartbeat("r1")
