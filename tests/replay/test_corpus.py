"""Replay over each trace corpus (ours; the real one when named): every state × teacher becomes a row,
each teacher sees the agent's rendered prefix and the tools the stream used, and no scrubbed secret or
key reaches a request."""

from __future__ import annotations

import re
import subprocess
import sys

import orjson
import pyarrow.parquet as pq
import pytest

from composer_pipeline.ledger import Ledger
from composer_pipeline.render import RenderOptions
from composer_pipeline.replay.run import ReplayRun
from composer_pipeline.teachers.cache import ResponseCache

from .conftest import make_config, teacher_dict

SECRET_RE = re.compile(rb"(sk-ant-[A-Za-z0-9_-]{20,}|ghp_[A-Za-z0-9]{30,}|AKIA[0-9A-Z]{16})")


@pytest.fixture(scope="module")
def corpus_tables(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"{corpus.name}-ingested")
    subprocess.run(
        [sys.executable, "-m", "composer_pipeline", "ingest", str(corpus.root), "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return pq.read_table(out / "trace_states.parquet"), pq.read_table(out / "trace_messages.parquet")


def test_sessions_replay(corpus_tables, server, tmp_path):
    states, messages = corpus_tables
    assert states.num_rows > 40
    states = states.slice(0, 40)
    cfg = make_config(
        server.url, teachers=[teacher_dict(server.url, "a"), teacher_dict(server.url, "b", model="other")]
    )
    cache, ledger = ResponseCache(tmp_path / "c"), Ledger(tmp_path / "l.sqlite")
    run = ReplayRun.prepare(states, messages, cfg, RenderOptions())
    plan = run.plan(cache, ledger)
    assert plan.table.num_rows == 80 and plan.fits
    res = run.replay({}, cache=cache, ledger=ledger, run_id="corpus")
    rows = res.table.to_pylist()
    assert len(rows) == 80 and {(r["state_id"], r["teacher"]) for r in rows} == {
        (s, t) for s in states.column("state_id").to_pylist() for t in ("a", "b")
    }
    assert {r["status"] for r in rows} == {"answered"}
    assert len(server.requests) == 80
    for req in server.requests:
        body = orjson.loads(req.body)
        assert body["messages"][0]["role"] == "system" and len(body["messages"]) >= 2
        # prompt_cache_key (issue #22): a hash of the stream, never its id (which names the project and session)
        assert re.fullmatch(r"cp-[0-9a-f]{32}", body.pop("prompt_cache_key"))
        assert set(body) <= {"model", "messages", "tools", "max_tokens", "temperature"}
        assert not SECRET_RE.search(req.body) and req.authorization is None
    # the agent's own tool calls are among the tools offered at its state
    from composer_pipeline.teachers.cache import call_id

    body_by_cid = {}
    for req in server.requests:
        body = orjson.loads(req.body)
        # transport only: not part of the call_id
        body.pop("prompt_cache_key")
        if body["model"] == "scripted":
            body_by_cid[call_id("a", "scripted", body, server.url)] = body
    checked = 0
    for st in states.to_pylist():
        called = {c["name"] for c in orjson.loads(st["action"])["tool_calls"]}
        if not called:
            continue
        cid = next(r["call_id"] for r in rows if r["state_id"] == st["state_id"] and r["teacher"] == "a")
        offered = {t["function"]["name"] for t in body_by_cid[cid].get("tools", [])}
        assert called <= offered, (st["state_id"], called, offered)
        checked += 1
    assert checked >= 10
