"""The project's own corpus (tests/support/traces.py): the facts its code states by
construction, checked the way test_real_traces.py checks the real sessions."""

from __future__ import annotations

import orjson

from composer_pipeline.render import RenderOptions, action_of, render_state
from tests.support.traces import EXPECTED, L1, LEGACY, T1, TOOLSMITH

from .test_corpus import check_rendered


def _state(ours, key: str, message_id: str) -> dict:
    return next(s for s in ours.states(key) if s["message_id"] == message_id)


def _users(messages: list[dict]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "user"]


def test_states_per_file_bad_lines_and_warmup(ours):
    reports = {rep["file"]: rep for r in ours.results for rep in r.file_reports}
    assert {f: rep["states"] for f, rep in reports.items()} == EXPECTED["states"]
    assert {f: rep["bad_lines"] for f, rep in reports.items() if rep["bad_lines"]} == EXPECTED["bad_lines"]
    assert sum(rep.get("warmup_dropped", 0) for rep in reports.values()) == 1
    assert reports[f"{TOOLSMITH}/{T1}.jsonl"]["compactions_crossed"] >= 1
    states = [s for r in ours.results for s in r.states.to_pylist()]
    assert {s["version"] for s in states} == EXPECTED["versions"]
    assert not any(s["message_id"] == "msg_T1_synthetic" for s in states)  # the API error is not a state


def test_subagent_links_in_three_layouts(ours):
    states = [s for r in ours.results for s in r.states.to_pylist()]
    for kind, (tool_use_id, agent_id) in EXPECTED["subagent_links"].items():
        linked = [s for s in states if s["stream_kind"] == kind and s["parent_tool_use_id"]]
        assert {(s["parent_tool_use_id"], s["agent_id"]) for s in linked} == {(tool_use_id, agent_id)}
    inline = [s for s in states if s["stream_kind"] == "inline_sidechain"]
    assert sorted({s["parent_tool_use_id"] for s in inline}) == EXPECTED["inline_links"]
    # two sidechains, records interleaved in one file
    assert len({s["stream_id"] for s in inline}) == 2
    unlinked = [s for s in states if s["stream_kind"] != "main" and not s["parent_tool_use_id"]]
    assert len(unlinked) == EXPECTED["unlinked_subagent_states"] and unlinked[0]["agent_id"].startswith("acompact-")
    # subagents carry their parent's session id
    for r in ours.results:
        assert len({s["session_id"] for s in r.states.to_pylist()}) <= 1


def test_split_response_is_one_traceable_state(ours):
    e = EXPECTED["split"]
    st = _state(ours, e["session_key"], e["message_id"])
    assert st["source_lines"] == e["source_lines"] and st["source_file"] == e["source_file"]
    a = action_of(st)
    assert [c.name for c in a.tool_calls] == e["tools"] and a.thinking and a.text
    assert st["version"] == "2.1.38" and st["model"] and st["timestamp"]
    assert orjson.loads(st["usage"])["output_tokens"] > 0


def test_rejected_parallel_calls_are_the_error_after(ours):
    (st,) = ours.states(EXPECTED["rejected"]["session_key"])
    errs = orjson.loads(st["error_after"])
    assert st["has_error"] and [e["tool_name"] for e in errs] == EXPECTED["rejected"]["tools"]
    assert "doesn't want to proceed" in errs[0]["content"]


def test_parallel_calls_progress_chain_and_compaction(ours):
    key = f"{TOOLSMITH}__{T1}"
    conv = ours.conv(key)
    msgs = render_state(conv, _state(ours, key, "msg_T1_03"), RenderOptions()).messages
    check_rendered(msgs)
    last = [m for m in msgs if m["role"] == "assistant"][-1]
    assert [c["function"]["name"] for c in last["tool_calls"]] == ["Read", "Read", "Bash"]  # one response, 4 records
    assert [m["tool_call_id"] for m in msgs[-3:]] == [c["id"] for c in last["tool_calls"]]
    assert msgs[-2]["content"] == "def test_quiet():\n    assert run(['--quiet']) == 0"  # a list result, flattened
    assert not any("hook_progress" in str(m.get("content")) for m in msgs)  # progress links never render
    after = render_state(conv, _state(ours, key, "msg_T1_07"), RenderOptions()).messages
    full = render_state(conv, _state(ours, key, "msg_T1_07"), RenderOptions(compaction="full")).messages
    assert (
        _users(after)[0].startswith("This session is being continued") and _users(after)[-1] == "also update the README"
    )
    assert _users(full)[0] == "add a --verbose flag to the CLI" and "now run the tests" in _users(full)
    worker = next(s for s in ours.states(key) if s["agent_id"] and s["agent_id"].startswith("acompact-"))
    assert _users(render_state(conv, worker, RenderOptions()).messages) == [
        "Your task is to create a detailed summary of the conversation so far."
    ]


def test_rewind_and_subagent_prompts(ours):
    e = EXPECTED["rewind"]
    users = _users(
        render_state(
            ours.conv(e["session_key"]), _state(ours, e["session_key"], e["message_id"]), RenderOptions()
        ).messages
    )
    assert users[-1] == e["last_user"] and e["dropped_user"] not in users
    key = f"{LEGACY}__{L1}"
    conv = ours.conv(key)
    main = [s for s in ours.states(key) if s["stream_kind"] == "main"]
    msgs = render_state(conv, main[-1], RenderOptions()).messages
    assert [m["content"] for m in msgs if m["role"] == "tool"][:2] == [
        "## Models\n- User\n- Order",
        "## Raw SQL\n- app/db.py:10\n- app/report.py:3",
    ]  # Task results (lists)
    assert "[Request interrupted by user]" in _users(msgs)
    for side in (s for s in ours.states(key) if s["stream_kind"] == "inline_sidechain"):
        first = _users(render_state(conv, side, RenderOptions()).messages)[0]
        assert first in ("List every model class", "List every raw SQL query")
