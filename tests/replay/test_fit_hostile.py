"""Hostile prefixes against a small window (issue 30, item 12): a 5 MB tool-call argument, a tools list of
20,000 argument names and one turn of 300 parallel calls. Each is fitted under the window or never sent:
nothing goes out over the window, and what is skipped is counted in the plan with its reason."""

from __future__ import annotations

import orjson

from composer_pipeline.ledger import Ledger
from composer_pipeline.render import CUT_MARKER, count_tokens, fit_messages
from composer_pipeline.replay.plan import plan_requests
from composer_pipeline.replay.requests import make_request
from composer_pipeline.replay.run import replay_requests
from composer_pipeline.teachers.cache import ResponseCache
from tests.support.provider_emulator import ModelRules, ProviderEmulator

from .test_caching import config, teacher

WINDOW, MAX_TOKENS = 8_000, 64
BUDGET = WINDOW - MAX_TOKENS
READ = {"type": "function", "function": {"name": "Read", "parameters": {"type": "object", "properties": {}}}}


def _call(cid: str, name: str, args: dict) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": orjson.dumps(args).decode()}}


def _start() -> list[dict]:
    return [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "write the file"}]


def huge_write() -> list[dict]:
    """The last turn writes a 5 MB file: the size is in the call's arguments, not in any content."""
    body = "HEAD" + "line of generated code\n" * (5_000_000 // 23) + "TAIL"
    write = _call("toolu_w", "Write", {"file_path": "/repo/big.py", "content": body})
    return _start() + [
        {"role": "assistant", "content": "Writing it.", "tool_calls": [write]},
        {"role": "tool", "tool_call_id": "toolu_w", "content": "File created successfully"},
    ]


def wide_tools() -> list[dict]:
    """A tool the agent called with 20,000 different argument names."""
    return [
        READ,
        {
            "type": "function",
            "function": {
                "name": "Edit",
                "description": "The Edit tool as used by the agent in this session.",
                "parameters": {"type": "object", "properties": {f"key_{i:05d}": {} for i in range(20_000)}},
            },
        },
    ]


def parallel_calls(n: int = 300) -> list[dict]:
    """One turn of ``n`` parallel calls, each answered: a unit that elision cannot split."""
    calls = [_call(f"toolu_{i:03d}", "Read", {"file_path": f"/repo/f{i}.py"}) for i in range(n)]
    return (
        _start()
        + [{"role": "assistant", "content": "Reading everything.", "tool_calls": calls}]
        + [{"role": "tool", "tool_call_id": c["id"], "content": f"contents of f{i}"} for i, c in enumerate(calls)]
    )


def test_a_huge_tool_call_argument_is_cut_in_its_middle_and_stays_json():
    msgs = huge_write()
    f = fit_messages(msgs, [READ], BUDGET)
    assert f.fits and f.tokens <= BUDGET and f.cut == 1
    (call,) = f.messages[2]["tool_calls"]
    args = orjson.loads(call["function"]["arguments"])  # still valid JSON, still the same call
    assert call["id"] == "toolu_w" and args["file_path"] == "/repo/big.py"
    assert args["content"].startswith("HEAD") and args["content"].endswith("TAIL")
    assert CUT_MARKER.split("{n}")[0].strip() in args["content"]
    assert f.messages[3] == msgs[3]  # its result, untouched


def test_a_tools_list_too_large_for_the_window_loses_argument_names():
    msgs = _start()
    tools = wide_tools()
    assert count_tokens(tools) > 10 * WINDOW
    f = fit_messages(msgs, tools, BUDGET)
    assert f.fits and f.tokens <= BUDGET and f.cut == 1
    assert count_tokens(f.tools) <= BUDGET // 4
    read, edit = f.tools
    assert read == READ and 0 < len(edit["function"]["parameters"]["properties"]) < 20_000
    kept = len(edit["function"]["parameters"]["properties"])
    assert f"({20_000 - kept} more argument names omitted" in edit["function"]["description"]
    assert f.messages == msgs


def test_a_turn_that_cannot_fit_is_reported_not_fitted():
    f = fit_messages(parallel_calls(), [READ], BUDGET)
    assert not f.fits and f.tokens > BUDGET
    calls = {c["id"] for m in f.messages if m.get("tool_calls") for c in m["tool_calls"]}
    assert calls == {m["tool_call_id"] for m in f.messages if m["role"] == "tool"}  # never a call unanswered


def test_nothing_is_sent_over_the_window_and_the_skip_is_counted_in_the_plan(tmp_path):
    emu = ProviderEmulator({"small": ModelRules("openai", WINDOW, 0.5, 1.5, 0.05, bytes_per_token=4.0)}).start()
    try:
        cfg = config([teacher(emu, "small", "small", context_window=WINDOW, max_tokens=MAX_TOKENS)])
        (t,) = cfg.teachers
        reqs = [
            make_request("write", "k", t, huge_write(), [READ], stream_id="a", order=4),
            make_request("tools", "k", t, _start(), wide_tools(), stream_id="b", order=2),
            make_request("parallel", "k", t, parallel_calls(), [READ], stream_id="c", order=302),
        ]
        ledger, cache = Ledger(tmp_path / "l.sqlite"), ResponseCache(tmp_path / "c")
        plan = plan_requests(reqs, cfg, cache, ledger)
        skipped = dict(zip(plan.table.column("state_id").to_pylist(), plan.table.column("skip_reason").to_pylist()))
        assert skipped["write"] is None and skipped["tools"] is None
        assert skipped["parallel"].startswith("over_context_window: not sent")
        assert plan.skipped_by_teacher == {"small": 1}
        worst = dict(zip(plan.table.column("state_id").to_pylist(), plan.table.column("worst_case_usd").to_pylist()))
        assert worst["parallel"] == 0.0 and plan.worst_case_by_teacher["small"] == worst["write"] + worst["tools"]
        res = replay_requests(reqs, cfg, {}, cache=cache, ledger=ledger, run_id="r")
        rows = {r["state_id"]: r for r in res.table.to_pylist()}
        assert rows["write"]["status"] == rows["tools"]["status"] == "answered"
        assert rows["parallel"]["status"] == "failed" and rows["parallel"]["reason"] == skipped["parallel"]
        assert rows["parallel"]["attempts"] == 0 and rows["parallel"]["cost_usd"] == 0.0
        assert emu.over_window == [] and len(emu.requests) == 2  # each sent once, none over the window
        assert all(len(orjson.dumps(s.body)) / 4.0 + MAX_TOKENS <= WINDOW for s in emu.requests)
        assert res.summary["over_context_window"] == 1
    finally:
        emu.stop()
