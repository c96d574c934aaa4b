"""The real Claude Code sessions named by COMPOSER_REAL_TRACES: facts counted by hand in those files.

The same kinds of facts about the project's own corpus: test_project_corpus.py; the invariants that
hold on every corpus: test_corpus.py.
"""

from __future__ import annotations

import orjson
import pytest

from composer_pipeline.render import RenderOptions, action_of, render_state

from .test_corpus import check_rendered

pytestmark = pytest.mark.real_traces

KIM = "d-kimuson__claude-code-viewer"
KF = "kfischer-okarin__scripts-and-tools"

# Counted by hand, independently of the parser: the distinct `message.id` values on lines with
# "type":"assistant" (agent_progress copies excluded), e.g.
#   grep -v agent_progress F | grep '"type":"assistant"' | grep -o '"id":"msg_[^"]*"' | sort -u | wc -l
# b3edadab: read the 60 lines: 15 responses (msg_01Ciac..., msg_01BK72..., ... msg_01RGP4...), two
# of them on rewound branches (lines 35 and 43 restart from 8fe00b4a); no synthetic ones.
# subagent.jsonl: 12 responses; lines 17-19 and 22 are ONE response (msg_01FqB3...) split around
# the Glob result, lines 77 and 81 one response (msg_01Dy5b...) split around hook progress.
# fe5e1c67: 9 main responses + 161 in the five inline sidechains = 170.
# agent-a434715.jsonl: 3 responses; agent-a86dcdc.jsonl is a Warmup stub: 0.
EXPECTED = {
    f"{KF}/b3edadab-bca0-4054-9b41-f7ffa6941260.jsonl": 15,
    f"{KF}/agent-a434715.jsonl": 3,
    f"{KF}/agent-a86dcdc.jsonl": 0,
    "marot__spotter/subagent.jsonl": 12,
    "marot__spotter/short.jsonl": 1,
    "marot__spotter/tool_heavy.jsonl": 4,
    f"{KIM}/fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl": 170,
    f"{KIM}/5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl": 20,
    f"{KIM}/1af7fc5e-8455-4414-9ccd-011d40f70b2a.jsonl": 7,
    f"{KF}/3f6ddfee-788c-48a5-8f7a-d43377b51472.jsonl": 0,  # summary records only
    f"{KF}/6d3dc917-03e0-448d-a7a5-d5e6c1a6dd27.jsonl": 0,  # file-history-snapshot only
    f"{KF}/a751b8dd-6b29-4eed-8cb9-64bc9a916a39.jsonl": 0,  # summaries + snapshots
}


def test_every_file_ingests_with_hand_checked_counts(real):
    reports = {rep["file"]: rep for r in real.results for rep in r.file_reports}
    assert {f: reports[f]["states"] for f in EXPECTED} == EXPECTED


def test_rejected_calls_end_a_session_as_error_after(real):
    # in this set the interrupts come at session ends (no later state sees them); they show up as error_after:
    short = real.states("marot__spotter__short")[0]
    # both parallel calls were rejected by the user (lines 11-12)
    errs = orjson.loads(short["error_after"])
    assert short["has_error"] and [e["tool_name"] for e in errs] == ["Bash", "Glob"]
    assert "doesn't want to proceed" in errs[0]["content"]


def test_subagent_links_and_warmup(real):
    b3 = real.states(f"{KF}__b3edadab-bca0-4054-9b41-f7ffa6941260")
    agent = [s for s in b3 if s["stream_kind"] == "sibling_agent_file"]
    assert len(agent) == 3 and {s["agent_id"] for s in agent} == {"a434715"}
    # the Task call at line 23 spawned it: its result (line 24) has toolUseResult.agentId
    assert {s["parent_tool_use_id"] for s in agent} == {"toolu_014b1V7NgWhMapv346LFg4Y3"}
    assert all(s["session_id"] == "b3edadab-bca0-4054-9b41-f7ffa6941260" for s in b3)
    assert real.report(f"{KF}/agent-a86dcdc.jsonl")["warmup_dropped"] == 1
    # 1.0.x inline sidechains: five roots, each linked to its Task tool_use by prompt text
    fe = real.states(f"{KIM}__fe5e1c67-53e7-4862-81ae-d0e013e3270b")
    sides = {s["stream_id"]: s["parent_tool_use_id"] for s in fe if s["stream_kind"] == "inline_sidechain"}
    assert len(sides) == 5 and all(v and v.startswith("toolu_") for v in sides.values())
    assert "toolu_01LS6tcVd796SbQKmZqeVnWY" in sides.values()  # root at line 16


def test_state_fields_traceable(real):
    st = next(s for s in real.states("marot__spotter__subagent") if s["message_id"] == "msg_01FqB3YigWWkQYHv4wfbcsgM")
    assert st["source_lines"] == [17, 18, 19, 22]  # streaming split around the Glob result
    assert st["source_file"] == "marot__spotter/subagent.jsonl"
    assert [c.name for c in action_of(st).tool_calls] == ["Glob", "WebSearch"]
    assert action_of(st).thinking  # thinking stays in the action
    assert st["version"] == "2.1.38" and st["model"] and st["timestamp"]
    assert orjson.loads(st["usage"])["output_tokens"] > 0
    # the last tool result of the 4 parallel calls
    assert st["prefix_leaf_uuid"].startswith("b9e31962")


def test_render_parallel_calls_and_chain_order(real):
    conv = real.conv("marot__spotter__subagent")
    states = real.states("marot__spotter__subagent")
    st = next(s for s in states if s["message_id"] == "msg_01FqB3YigWWkQYHv4wfbcsgM")
    msgs = render_state(conv, st, RenderOptions()).messages
    asst = [m for m in msgs if m["role"] == "assistant"]
    # one assistant message for the 4-record response with 4 parallel calls, results by id
    assert [c["function"]["name"] for c in asst[-1]["tool_calls"]] == [
        "WebFetch",
        "WebSearch",
        "WebSearch",
        "WebSearch",
    ]
    assert [m["role"] for m in msgs[-4:]] == ["tool"] * 4
    assert msgs[-4]["tool_call_id"] == asst[-1]["tool_calls"][0]["id"]
    # 2.1.x progress records sit in the chain (hook_progress between Write and its result) but never render
    last = states[-1]
    full = render_state(conv, last, RenderOptions()).messages
    check_rendered(full)
    assert not any("hook_progress" in str(m.get("content")) for m in full)
    # order follows the parentUuid chain: user prompts appear in chain order
    users = [m["content"] for m in full if m["role"] == "user"]
    assert users.index("create the beads") > 0


def test_render_list_tool_results_and_rewinds(real):
    key = f"{KIM}__fe5e1c67-53e7-4862-81ae-d0e013e3270b"
    conv = real.conv(key)
    main = [s for s in real.states(key) if s["stream_kind"] == "main"]
    msgs = render_state(conv, main[-1], RenderOptions()).messages
    task_results = [m for m in msgs if m["role"] == "tool" and "## " in m["content"]]
    assert task_results, "Task results (content lists) are flattened to text"
    # sidechain prefixes start at the subagent's own prompt, not the parent session
    side = next(s for s in real.states(key) if s["stream_kind"] == "inline_sidechain" and s["n_prefix_messages"] > 3)
    smsgs = render_state(conv, side, RenderOptions()).messages
    assert smsgs[1]["role"] == "user" and "orchestrator" not in smsgs[1]["content"]
    # a rewound branch: b3edadab line 43 restarts from 8fe00b4a, so the edits of lines 28-41 are not in its prefix
    b3 = f"{KF}__b3edadab-bca0-4054-9b41-f7ffa6941260"
    st = next(s for s in real.states(b3) if s["message_id"] == "msg_01KFf4p3CogSSLxEU9zziR9o")
    users = [m["content"] for m in render_state(real.conv(b3), st, RenderOptions()).messages if m["role"] == "user"]
    assert users[-1].startswith("Ok in the future")
    assert not any(u.startswith("Ok I came from the future") for u in users)
