"""Invariants that hold on every corpus (ours always; the real one when COMPOSER_REAL_TRACES names it):
nothing lost, the expected states and stream kinds, well-formed renders, actions that round-trip."""

from __future__ import annotations

from collections import Counter

import orjson

from composer_pipeline.actions import Action
from composer_pipeline.render import INTERRUPTED, RenderOptions, action_of, render_state


def check_rendered(messages: list[dict]) -> None:
    """Each tool message answers the next open call of the assistant message before it; JSON-clean."""
    pending: list[str] = []
    for m in messages:
        if m["role"] == "tool":
            assert pending and m["tool_call_id"] == pending.pop(0), "tool message must answer the next open call"
        else:
            assert not pending, f"unanswered tool calls {pending}"
            if m["role"] == "assistant":
                pending = [c["id"] for c in m.get("tool_calls") or []]
    assert not pending
    assert orjson.loads(orjson.dumps(messages)) == messages


def test_every_file_ingests_and_nothing_is_lost(ingested, corpus):
    files = {p.relative_to(corpus.root).as_posix() for p in corpus.root.rglob("*.jsonl")}
    reports = {rep["file"]: rep for r in ingested.results for rep in r.file_reports}
    assert set(reports) == files
    # nothing lost: every line is a record or a quarantine row
    for rep in reports.values():
        assert rep["records"] + rep["bad_lines"] == rep["lines"]
    assert sum(r.states.num_rows for r in ingested.results) == sum(rep["states"] for rep in reports.values())
    states = [s for r in ingested.results for s in r.states.to_pylist()]
    assert len(states) == corpus.expect["total_states"]
    assert Counter(s["stream_kind"] for s in states) == corpus.expect["kinds"]


def test_render_invariants_on_every_state(ingested, corpus):
    n_states = 0
    for r in ingested.results:
        conv = ingested.conv(r.session_key)
        for st in r.states.to_pylist():
            rs = render_state(conv, st, RenderOptions())
            check_rendered(rs.messages)
            assert rs.messages[0]["role"] == "system"
            assert len(rs.messages) == st["n_prefix_messages"]  # ingest's linear count == renderer
            # an interrupted call (no result) can only be among the last messages of a prefix
            assert not any(m["role"] == "tool" and m["content"] == INTERRUPTED for m in rs.messages[:-4])
            # the tools offered include every tool the prefix and the agent's own action call
            called = {c["function"]["name"] for m in rs.messages for c in m.get("tool_calls") or []}
            called |= {c.name for c in action_of(st).tool_calls}
            assert called <= {t["function"]["name"] for t in rs.tools}, st["state_id"]
            n_states += 1
    assert n_states == corpus.expect["total_states"]


def test_actions_round_trip(ingested):
    for r in ingested.results:
        for st in r.states.to_pylist():
            a = action_of(st)
            assert Action.from_json(a.to_json()) == a
