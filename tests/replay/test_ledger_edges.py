"""Ledger edges: paid answers served without a key and with an empty cache, a dead run finalized by
the next replay at its start, passwords in odd places of a PostgreSQL URL never echoed, a read-only
PostgreSQL role reading budgets, and a transaction that meets a dropped connection reopening it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pyarrow.parquet as pq
import pytest
import yaml
from ledger_helpers import ledger_rows

from composer_pipeline.cli import main
from composer_pipeline.ledger import Ledger, LedgerError, Reserve, redact_url
from composer_pipeline.replay.run import replay_requests
from composer_pipeline.teachers.cache import ResponseCache

from .conftest import make_config, scripted_request, teacher_dict


def _yaml(tmp_path, url, **over) -> str:
    p = tmp_path / "teachers.yaml"
    p.write_text(
        yaml.safe_dump({"ceiling_usd": 5.0, "teachers": [teacher_dict(url, "t1", api_key_env="T1_KEY", **over)]})
    )
    return str(p)


def test_paid_answers_are_served_without_the_key_and_without_the_cache(
    tmp_path, server, samples_dir, ledger_url, monkeypatch
):
    teachers = _yaml(tmp_path, server.url)
    monkeypatch.setenv("T1_KEY", "sk-test-0123456789abcdef")
    args = ["replay", "--states", str(samples_dir), "--teachers", teachers, "--ledger", ledger_url]
    assert main([*args, "--out", str(tmp_path / "o1"), "--cache", str(tmp_path / "c1")]) == 0
    n = len(server.requests)
    monkeypatch.delenv("T1_KEY")
    assert main([*args, "--out", str(tmp_path / "o2"), "--cache", str(tmp_path / "c2")]) == 0  # empty cache, no key
    rows = pq.read_table(tmp_path / "o2" / "replays.parquet").to_pylist()
    assert rows and {r["status"] for r in rows} == {"answered"} and all(r["paid_usd"] == 0 for r in rows)
    assert len(server.requests) == n
    assert len(ResponseCache(tmp_path / "c2")) == len(rows)  # the cache repaired from the ledger


def test_the_next_replay_finalizes_a_dead_run_at_its_start(tmp_path, server, ledger_url):
    """A run killed mid-call (its process gone) holds a sent reservation; the next replay has nothing to wait
    for (everything cached), yet leaves nothing reserved."""
    cfg = make_config(server.url)
    cache = ResponseCache(tmp_path / "c")
    ledger = Ledger(ledger_url)
    replay_requests([scripted_request(cfg, 0)], cfg, {}, cache=cache, ledger=ledger, run_id="first")
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    # a long lease: only the missing process tells it is dead
    ledger.start_run("killed", 600.0)
    ledger._tx(lambda c: c.execute("UPDATE runs SET pid = ? WHERE run_id = 'killed'", [int(dead)]))
    res = ledger.try_reserve(Reserve("t1", 10.0, "killed", 10.0, 0.25, "x" * 64))
    ledger.mark_sent(res.id)
    assert ledger.open_reservations() == 1
    out = replay_requests([scripted_request(cfg, 0)], cfg, {}, cache=cache, ledger=ledger, run_id="second")
    assert out.summary["from_cache"] == 1 and out.summary["reservation_waits"] == 0
    assert ledger.open_reservations() == 0
    row = next(r for r in ledger_rows(ledger, "reservations") if r["run_id"] == "killed")
    assert row["state"] == "kept" and "process gone" in row["note"]
    assert {r["run_id"]: r["state"] for r in ledger_rows(ledger, "runs")}["killed"] == "expired"


@pytest.mark.parametrize(
    "url, secret",
    [
        ("postgresql://u@127.0.0.1:1/db?password=s3cretQP&sslmode=disable", "s3cretQP"),
        ("postgresql://u:pa%zzW0rd@127.0.0.1:1/db", "pa%zzW0rd"),
        ("postgresql://u:pa%zzW0rd@127.0.0.1:1/db", "pa%zz"),
        ("postgresql://u:p%40ssW0rd@127.0.0.1:1/db", "p@ssW0rd"),
        ("postgresql://u@127.0.0.1:1/db?sslmode=disable&password=s3cretQP", "s3cretQP"),
    ],
)
def test_a_postgres_password_is_never_echoed(url, secret, tmp_path, capsys):
    assert secret not in redact_url(url) and "***" in redact_url(url)
    with pytest.raises(LedgerError) as e:
        Ledger(url)
    assert secret not in str(e.value)
    teachers = tmp_path / "t.yaml"
    teachers.write_text(yaml.safe_dump({"ceiling_usd": 1.0, "teachers": [teacher_dict("http://127.0.0.1:9/v1")]}))
    assert main(["teachers", "budget", "--teachers", str(teachers), "--ledger", url]) == 2
    out, err = capsys.readouterr()
    assert "ledger" in err and secret not in out + err


def test_a_read_only_postgres_role_reads_budgets(tmp_path, postgres_server, server):
    import psycopg2

    db = f"ro_{uuid.uuid4().hex[:10]}"
    url = postgres_server.create_database(db)
    cfg = make_config(server.url)
    replay_requests(
        [scripted_request(cfg, 0)], cfg, {}, cache=ResponseCache(tmp_path / "c"), ledger=Ledger(url), run_id="r"
    )
    con = psycopg2.connect(url)
    con.autocommit = True
    role = f"reader_{uuid.uuid4().hex[:8]}"
    with con.cursor() as cur:
        cur.execute(f"CREATE ROLE {role} LOGIN")
        cur.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    con.close()
    ro_url = url.replace("postgresql://postgres@", f"postgresql://{role}@")
    teachers = tmp_path / "t.yaml"
    teachers.write_text(yaml.safe_dump({"ceiling_usd": 1.0, "teachers": [teacher_dict(server.url)]}))
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "composer_pipeline",
            "teachers",
            "budget",
            "--teachers",
            str(teachers),
            "--ledger",
            ro_url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    assert p.returncode == 0, p.stderr
    line = __import__("json").loads(p.stdout.strip().splitlines()[0])
    assert line["teacher"] == "t1" and line["settled_usd"] > 0


def test_a_dropped_connection_is_reopened(postgres_server, tmp_path, server):
    """The server ends this process's session (what a restart does to every session): the next
    transaction reconnects instead of failing on the dead connection (before: InterfaceError forever)."""
    import psycopg2

    url = postgres_server.create_database(f"drop_{uuid.uuid4().hex[:10]}")
    ledger = Ledger(url)
    assert ledger.spent("t1") == 0.0
    con = psycopg2.connect(url)
    con.autocommit = True
    with con.cursor() as cur:
        cur.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND datname = current_database()"
        )
    con.close()
    for _ in range(3):
        assert ledger.spent("t1") == 0.0
    cfg = make_config(server.url)
    res = replay_requests(
        [scripted_request(cfg, 0)], cfg, {}, cache=ResponseCache(tmp_path / "c"), ledger=ledger, run_id="r"
    )
    assert res.summary["answered"] == 1


@pytest.mark.slow
def test_answers_whose_settle_failed_on_a_full_disk_are_not_bought_again(tmp_path, server):
    """The SQLite ledger's disk fills while four calls are in flight: their settles fail (the ledger cannot
    grow), the answers go to the response cache and the spool beside it (another volume, here: small files
    under the limit), and the re-run records the held settles at their actual cost, then serves the answers
    instead of buying them again.

    The full disk is simulated at the OS boundary: ``RLIMIT_FSIZE`` set on the running replay process from
    outside (``prlimit``), so every write past 8 KiB into a file fails with EFBIG (SIGXFSZ ignored), as a
    full disk's writes fail with ENOSPC; the ledger's write-ahead log is already larger, the cache files are not."""
    import resource
    import time

    from .test_concurrency import _result, _start

    server.latency_s = 1.5
    states = [0, 1, 2, 3]
    args = {
        "url": server.url,
        "ledger": str(tmp_path / "ledger.sqlite"),
        "cache": str(tmp_path / "cache"),
        "states": states,
        "max_concurrency": 4,
        "ignore_sigxfsz": True,
    }
    p = _start({**args, "run": "full"})
    deadline = time.monotonic() + 90
    while len(server.requests) < len(states):
        assert time.monotonic() < deadline and p.poll() is None, p.communicate()
        time.sleep(0.01)
    assert os.path.getsize(tmp_path / "ledger.sqlite-wal") > 8192
    resource.prlimit(p.pid, resource.RLIMIT_FSIZE, (8192, 8192))
    # it cannot close its run either: exits with the ledger error
    p.communicate(timeout=90)
    assert len(server.billed) == len(states)
    # the paid answers, kept where they could be
    assert len(ResponseCache(tmp_path / "cache")) == len(states)
    rc, out = _result(_start({**args, "run": "after"}))
    assert rc == 0 and out["summary"]["answered"] == len(states) and out["summary"]["from_cache"] == len(states)
    assert len(server.requests) == len(states)  # nothing bought again
    ledger = Ledger(tmp_path / "ledger.sqlite")
    assert ledger.open_reservations() == 0
    held = [r for r in ledger_rows(ledger, "reservations") if r["run_id"] == "full"]
    assert len(held) == len(states) and {r["state"] for r in held} == {"settled"}  # at the billed cost, once
    assert sum(r["cost_usd"] for r in held) == pytest.approx(sum(p * 1e-6 + c * 2e-6 for _, p, c in server.billed))
    assert not list((tmp_path / "cache" / "unrecorded").glob("*.pending"))
    assert {r["run_id"]: r["state"] for r in ledger_rows(ledger, "runs")} == {"full": "expired", "after": "closed"}


def test_answers_held_in_the_spool_are_recorded_by_the_next_run_with_that_cache(tmp_path, server, ledger_url, capsys):
    """A run stopped while it held paid answers the ledger could not record (issue 30, item 8) leaves them in
    ``<cache>/unrecorded/``: the next replay with that cache records them (settled at their cost, the answer
    stored) before it claims anything; a file that is not a held answer is set aside, named."""
    import orjson

    from composer_pipeline.ledger import AsyncLedger

    cfg = make_config(server.url)
    req = scripted_request(cfg, 7)
    ledger = Ledger(ledger_url)
    ledger.start_run("stopped", 0.2)
    res = ledger.try_reserve(Reserve("t1", 10.0, "stopped", 10.0, 0.25, req.call_id))
    ledger.mark_sent(res.id)
    answer = {"role": "assistant", "content": "Done."}
    response = {"choices": [{"index": 0, "finish_reason": "stop", "message": answer}], "model": "scripted"}
    record = {"teacher": "t1", "model": "scripted", "response": response, "cost_usd": 0.01, "run_id": "stopped"}
    spool = tmp_path / "c" / "unrecorded"
    held = AsyncLedger(ledger, "stopped", spool=spool)
    assert str(spool) in held._hold(
        res.id, {"state": "settled", "cost_usd": 0.01, "note": "", "answer": [req.call_id, record], "usage": None}
    )
    (spool / "junk.pending").write_bytes(b'{"not": "a held answer"}')
    out = replay_requests([req], cfg, {}, cache=ResponseCache(tmp_path / "c"), ledger=ledger, run_id="next")
    assert server.requests == [] and out.table.column("cache_hit").to_pylist() == [True]  # from the ledger
    row = next(r for r in ledger_rows(ledger) if r["id"] == res.id)
    assert row["state"] == "settled" and row["cost_usd"] == pytest.approx(0.01)
    assert ledger.answer(req.call_id) == record and ledger.spent("t1") == pytest.approx(0.01)
    assert sorted(p.name for p in spool.iterdir()) == ["junk.unreadable"]
    assert "not a held answer" in capsys.readouterr().err
    assert orjson.loads((spool / "junk.unreadable").read_bytes()) == {"not": "a held answer"}
