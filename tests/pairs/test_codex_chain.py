"""Codex rollouts through the unchanged chain: ingest -> show -> replay (a real loopback teacher server)
-> pairs -> export --format trl. Teachers get the rollout's own tools, every call answered, no key."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import orjson
import pytest

from composer_pipeline.store import Store
from composer_pipeline.train.config import HintTemplates
from composer_pipeline.train.data import load_train_data
from tests.ingest import codex_fixtures as fx
from tests.support.scripted_server import ScriptedServer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cli(*args, env):
    p = subprocess.run(
        [sys.executable, "-m", "composer_pipeline", *map(str, args)], env=env, cwd=REPO, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


@pytest.mark.slow
def test_codex_states_replay_pair_and_export(tmp_path):
    from tests.dagster.dagster_sessions import write_teachers_yaml

    for g in fx.GENERATIONS:
        fx.write(tmp_path / "codex" / g, g)
    server = ScriptedServer().start()
    try:
        env = {**os.environ, "COMPOSER_PIPELINE_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
        teachers = write_teachers_yaml(tmp_path / "teachers.yaml", server.url)
        store = tmp_path / "store"
        _cli("ingest", tmp_path / "codex", "--out", store, env=env)
        states = Store(str(store)).read_table("trace_states").to_pylist()
        assert len(states) == sum(fx.STEPS.values())
        shown = [
            json.loads(x)
            for x in _cli("show", states[-1]["state_id"], "--store", store, "--json", env=env).splitlines()
        ]
        assert shown and all(fx.ARG_KEY not in json.dumps(v) for v in shown)
        _cli("replay", "--states", store, "--teachers", teachers, "--out", store, env=env)
        bodies = [orjson.loads(r.body) for r in server.requests]
    finally:
        server.stop()
    assert len(bodies) == 3 * len(states)
    for body in bodies:
        text = json.dumps(body)
        for key in fx.PLANTED:
            assert key not in text
        calls = [c["id"] for m in body["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        answered = {m["tool_call_id"] for m in body["messages"] if m["role"] == "tool"}
        assert set(calls) <= answered
    offered = {t["function"]["name"] for b in bodies for t in b.get("tools") or []}
    assert {"shell", "exec_command", "apply_patch"} <= offered  # the rollouts' own tools
    _cli("pairs", "--replays", store, "--states", store, "--out", store, env=env)
    pairs = Store(str(store)).read_table("normalized_dpo_pairs").to_pylist()
    assert pairs and {p["source"] for p in pairs} == {"codex"}
    summary = json.loads(_cli("export", "--store", store, "--format", "trl", "--out", tmp_path / "ds", env=env))
    assert summary["sources"] == {"codex": len(pairs)}
    stored = "".join(
        p.read_bytes().decode("latin-1") for p in store.glob("*.parquet")
    )  # (compressed: also decoded below)
    tables = [Store(str(store)).read_table(t).to_pylist() for t in Store(str(store)).table_names()]
    dumped = json.dumps(tables, default=str)
    for key in fx.PLANTED:
        assert key not in dumped and key not in stored
    # lineage down to the raw rollout lines; the trainer's data loader takes the Codex rows as they are
    chain = json.loads(_cli("lineage", pairs[0]["pair_id"], "--store", store, "--json", env=env))
    assert chain["state"]["source"] == "codex" and chain["records"]
    assert all(
        r["uuid_matches"] and json.loads(r["raw"])["type"] in ("response_item", "message", "function_call", "reasoning")
        for r in chain["records"]
    )
    data = load_train_data(str(store), heldout_fraction=0.0, hints=HintTemplates())
    assert len(data.prompts) == len(states) and not data.skipped
    assert {p.state_id for p in data.prompts if p.hint} == {s["state_id"] for s in states if s["has_error"]}
