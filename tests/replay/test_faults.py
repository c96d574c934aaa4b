"""Fault injection against a real loopback server: every state × teacher ends answered or failed with
its reason, retries are bounded, Retry-After is honoured, and money follows the reservation rules."""

from __future__ import annotations

import socket
import time

import pytest
from ledger_helpers import ledger_rows, spend_by_run

from composer_pipeline.ledger import Ledger
from composer_pipeline.replay.requests import make_request
from composer_pipeline.replay.run import replay_requests
from composer_pipeline.teachers.cache import ResponseCache
from composer_pipeline.teachers.pricing import worst_case_usd

from .conftest import make_config, scripted_request


def _run(tmp_path, cfg, reqs, keys=None, run_id="r"):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    res = replay_requests(reqs, cfg, keys or {}, cache=ResponseCache(tmp_path / "cache"), ledger=ledger, run_id=run_id)
    return res, ledger, {r["state_id"]: r for r in res.table.to_pylist()}


def test_each_fault_ends_with_its_reason(tmp_path, server):
    cfg = make_config(server.url, max_retries=2, timeout_s=0.5)
    scripts = {
        "ok": "answer",
        "r429": "429:0.3,answer",
        "r500": "500,503,answer",
        "always500": "500",
        "hang": "hang:3",
        "truncjson": "truncjson",
        "cutbody": "cutbody",
        "reset": "reset",
        "garbage": "garbage",
        "bad400": "400",
        "nousage": "nousage",
    }
    reqs = [scripted_request(cfg, i, s) for i, s in enumerate(scripts.values())]
    worst = {r.state_id: r.worst_case_usd for r in reqs}
    t0 = time.perf_counter()
    res, ledger, rows = _run(tmp_path, cfg, reqs)
    assert time.perf_counter() - t0 < 15
    by = dict(zip(scripts, (rows[r.state_id] for r in reqs)))
    assert len(rows) == len(scripts) == res.table.num_rows

    ok = by["ok"]
    assert ok["status"] == "answered" and ok["reason"] is None and ok["attempts"] == 1
    assert '"name":"Read"' in ok["action"] and ok["prompt_tokens"] > 0 and ok["cost_usd"] > 0
    assert by["r429"]["status"] == "answered" and by["r429"]["attempts"] == 2
    assert by["r500"]["status"] == "answered" and by["r500"]["attempts"] == 3
    # the error responses were released: only the answer is paid
    for k in ("r429", "r500"):
        assert by[k]["cost_usd"] == pytest.approx(ok["cost_usd"], rel=0.2)

    a5 = by["always500"]
    assert (
        a5["status"] == "failed" and a5["reason"].startswith("http_500") and a5["attempts"] == 3 and a5["cost_usd"] == 0
    )
    bad = by["bad400"]
    assert bad["status"] == "failed" and bad["reason"].startswith("http_400") and bad["attempts"] == 1

    # sent, outcome unknown: each attempt's worst case stays spent
    hang = by["hang"]
    assert hang["status"] == "failed" and hang["reason"].startswith("timeout") and hang["attempts"] == 3
    assert hang["cost_usd"] == pytest.approx(3 * worst[hang["state_id"]])
    tj = by["truncjson"]
    assert (
        tj["status"] == "failed"
        and tj["reason"].startswith("invalid_json")
        and tj["cost_usd"] == pytest.approx(worst[tj["state_id"]])
    )
    cb = by["cutbody"]
    assert cb["status"] == "failed" and cb["reason"].startswith("truncated_body") and cb["attempts"] == 3
    rs = by["reset"]
    assert rs["status"] == "failed" and rs["reason"].startswith("connection_dropped") and rs["cost_usd"] > 0

    # answered but unparseable: raw kept with the reason
    g = by["garbage"]
    assert g["status"] == "answered" and g["action"] is None and g["reason"].startswith("unparseable")
    assert "not json at all" in g["raw_answer"]
    nu = by["nousage"]
    assert (
        nu["status"] == "answered"
        and nu["reason"].startswith("no_usage")
        and nu["cost_usd"] == pytest.approx(worst[nu["state_id"]])
    )

    # the ledger agrees with the rows, and the server saw exactly the attempts the rows report
    assert ledger.spent("t1") == pytest.approx(sum(r["cost_usd"] for r in rows.values()))
    assert len(server.requests) == sum(r["attempts"] for r in rows.values())
    assert res.summary["failures_by_reason"] == {
        "connection_dropped": 1,
        "http_400": 1,
        "http_500": 1,
        "invalid_json": 1,
        "timeout": 1,
        "truncated_body": 1,
    }
    assert res.summary["answered"] == 5 and res.summary["unparsed"] == 1


def test_retry_after_is_honoured(tmp_path, server):
    cfg = make_config(server.url, max_retries=1, backoff_s=0.0, backoff_max_s=0.0)
    t0 = time.perf_counter()
    _, _, rows = _run(tmp_path, cfg, [scripted_request(cfg, 0, "429:1,answer")])
    assert time.perf_counter() - t0 >= 1.0
    assert rows["state0000"]["status"] == "answered" and rows["state0000"]["attempts"] == 2


def test_connection_refused_is_released_not_spent(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = make_config(f"http://127.0.0.1:{port}/v1", max_retries=1)
    res, ledger, rows = _run(tmp_path, cfg, [scripted_request(cfg, 0)])
    row = rows["state0000"]
    assert row["status"] == "failed" and row["reason"].startswith("connection_error") and row["attempts"] == 2
    assert row["cost_usd"] == 0 and ledger.spent("t1") == 0
    assert {r["state"] for r in ledger_rows(ledger)} == {"released"}


def test_missing_key_fails_without_sending(tmp_path, server):
    cfg = make_config(server.url, api_key_env="SOME_TEACHER_KEY")
    _, _, rows = _run(tmp_path, cfg, [scripted_request(cfg, 0)], keys={})
    assert rows["state0000"]["status"] == "failed" and "SOME_TEACHER_KEY is not set" in rows["state0000"]["reason"]
    assert server.requests == []


def test_rerun_pays_nothing_and_identical_requests_are_sent_once(tmp_path, server):
    cfg = make_config(server.url)
    reqs = [scripted_request(cfg, i) for i in range(5)] + [scripted_request(cfg, 0)]  # state 0 twice
    res1, ledger, rows = _run(tmp_path, cfg, reqs, run_id="r1")
    assert len(server.requests) == 5 and res1.summary["http_requests"] == 5
    spent = ledger.spent("t1")
    res2, _, _ = _run(tmp_path, cfg, reqs, run_id="r2")
    assert len(server.requests) == 5  # nothing new reached the server
    assert res2.summary["http_requests"] == 0 and res2.summary["from_cache"] == 6 and res2.summary["spend_usd"] == 0
    assert ledger.spent("t1") == pytest.approx(spent)
    assert spend_by_run(ledger, "r2") == {} and spend_by_run(ledger, "r1")["t1"] == pytest.approx(spent)
    assert [r["action"] for r in res2.table.to_pylist()] == [r["action"] for r in res1.table.to_pylist()]


def test_call_id_is_a_content_address(server):
    cfg = make_config(server.url)
    a, b = scripted_request(cfg, 0), scripted_request(cfg, 0)
    assert a.call_id == b.call_id and len(a.call_id) == 64
    assert scripted_request(cfg, 1).call_id != a.call_id
    other = make_config(server.url, temperature=0.5)
    assert scripted_request(other, 0).call_id != a.call_id  # request params are part of the body
    msgs = [{"role": "user", "content": "hi"}]
    est, worst = worst_case_usd(make_request("s", None, cfg.teachers[0], msgs, None).body, cfg.teachers[0])
    assert est > 0 and worst == pytest.approx(est * 1e-6 + 50 * 2e-6)


def test_replay_puts_back_the_signal_handlers_it_found(tmp_path, server):
    """SIGTERM/SIGINT close a replay cleanly while it runs; afterwards the caller's handlers (Dagster's run
    worker, a user's script) are back, not the defaults."""
    import signal

    def mine(signum, frame):
        pass

    before = signal.signal(signal.SIGTERM, mine)
    try:
        res, ledger, _ = _run(tmp_path, make_config(server.url), [scripted_request(make_config(server.url), 0)])
        assert res.summary["answered"] == 1 and signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)
