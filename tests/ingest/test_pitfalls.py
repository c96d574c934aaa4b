"""SCHEMA_NOTES §8: one test per parser pitfall, on synthetic sessions built in code."""

from __future__ import annotations

import json

import orjson

from composer_pipeline.ingest.config import IngestRecipe
from composer_pipeline.ingest.discover import discover_sessions
from composer_pipeline.render import INTERRUPTED, Conversation, RenderOptions, action_of, render_state
from tests.support.sessions import Session, text, thinking, tool, uid

from .engines import ingest_checked


def ingest_dir(root, recipe=None):
    res = [ingest_checked(sf, recipe or IngestRecipe()) for sf in discover_sessions(root)]
    assert len(res) == 1
    return res[0]


def rendered(res, st, **opts):
    return render_state(Conversation.from_table(res.messages), st, RenderOptions(**opts)).messages


def test_1_invalid_lines_quarantined_and_chain_salvaged(tmp_path):
    s = Session()
    s.user("fix the bug")
    s.assistant(text("looking"), tool("Read", "t1", file_path="a.py"))  # lines 2-3
    res_uuid = s.result("t1", "content of a.py")  # line 4
    damaged_uuid = uid()
    # a truncated line that still holds its uuid and parentUuid
    s.raw(
        '{"parentUuid":"%s","isSidechain":false,"type":"user","uuid":"%s","message":{"role":"user","content":"and also fix'
        % (s.last, damaged_uuid)
    )
    s.last = damaged_uuid
    s.assistant(text("done"))
    s.raw("")  # blank line in the middle
    s.raw("[1, 2]")  # valid JSON, not an object
    s.raw("not json at all")
    s.write(tmp_path / "p" / "sess.jsonl")
    (tmp_path / "p" / "empty.jsonl").write_bytes(b"")  # 0-byte file from --resume
    results = [ingest_checked(sf, IngestRecipe()) for sf in discover_sessions(tmp_path)]
    empty = next(r for r in results if r.session_key == "p__empty")
    assert empty.states.num_rows == 0 and empty.file_reports[0]["empty_file"]
    res = next(r for r in results if r.session_key == "p__sess")
    q = res.quarantine.to_pylist()
    assert [(r["line_no"], r["reason"].split(":")[0].split(" (")[0]) for r in q] == [
        (5, "invalid JSON"),
        (7, "empty line"),
        (8, "not a JSON object"),
        (9, "invalid JSON"),
    ]
    assert q[0]["source_file"] == "p/sess.jsonl" and q[0]["salvaged_uuid"] == damaged_uuid
    assert q[0]["salvaged_parent_uuid"] == res_uuid
    assert q[3]["text"] == "not json at all" and q[3]["salvaged_uuid"] is None
    # the state after the damaged line still reaches the start of the conversation through it
    last = res.states.to_pylist()[-1]
    assert last["prefix_leaf_uuid"] == damaged_uuid
    msgs = rendered(res, last)
    assert msgs[1] == {"role": "user", "content": "fix the bug"} and msgs[-1]["role"] == "tool"
    assert res.file_reports[0]["bad_lines"] == 4


def test_2_unknown_types_pass_through(tmp_path):
    s = Session()
    s.user("hi")
    # unknown type with uuid: still a chain link
    s.rec("brand-new-record", data={"type": "mystery"})
    s.rec("system", subtype="never_seen_subtype", content="x")
    s.rec("progress", data={"type": "unknown_progress"})
    s.rec("attachment", attachment={"type": "future_attachment"})
    s.assistant({"type": "server_tool_use", "id": "s1", "name": "web"}, text("answer"), {"type": "future_block"})
    s.obj({"type": "custom-title", "title": "no uuid here"})
    res = ingest_dir(s.write(tmp_path / "p" / "s.jsonl").parent.parent)
    st = res.states.to_pylist()
    assert len(st) == 1 and action_of(st[0]).text == "answer"
    msgs = rendered(res, st[0])
    assert msgs == [msgs[0], {"role": "user", "content": "hi"}]  # walked through 4 unknown links
    types = res.messages.column("record_type").to_pylist()
    assert "brand-new-record" in types and "attachment" in types
    assert res.file_reports[0]["no_uuid_records"] == {"custom-title": 1}


def test_3_streaming_split_is_one_state_with_last_usage(tmp_path):
    s = Session()
    s.user("go")
    s.assistant(
        thinking("plan"), text("I'll read both"), tool("Read", "t1", file_path="a"), tool("Read", "t2", file_path="b")
    )
    res = ingest_dir(s.write(tmp_path / "p" / "s.jsonl").parent.parent)
    (st,) = res.states.to_pylist()
    assert st["source_lines"] == [2, 3, 4, 5] and len(st["record_uuids"]) == 4
    assert orjson.loads(st["usage"])["output_tokens"] == 40  # last record, not the first partial one
    a = action_of(st)
    assert a.thinking == "plan" and a.text == "I'll read both" and [c.id for c in a.tool_calls] == ["t1", "t2"]


def test_4_tool_results_and_meta_are_not_human_turns(tmp_path):
    s = Session()
    s.user("<command-message>init</command-message>")
    s.user([text("<system-reminder>injected</system-reminder>")], isMeta=True)
    s.assistant(tool("Bash", "t1", command="ls"))
    s.result("t1", "a.py")
    s.assistant(text("done"))
    res = ingest_dir(s.write(tmp_path / "p" / "s.jsonl").parent.parent)
    msgs = rendered(res, res.states.to_pylist()[-1])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool"]
    assert "injected" not in json.dumps(msgs)


def test_5_results_by_id_not_position_interrupted_and_orphans(tmp_path):
    s = Session()
    s.user("go")
    first = s.assistant(
        tool("Read", "t1", file_path="a"), tool("Read", "t2", file_path="b"), tool("Bash", "t3", command="x")
    )
    s.result("t2", "B", parent=first[1])  # results out of order, on side branches
    s.result("t1", "A", parent=first[0])
    # t3 never answered (interrupted); a result whose tool_use line was lost:
    s.result("t_lost", "orphan output")
    s.user("[Request interrupted by user for tool use]")
    s.assistant(text("ok"))
    res = ingest_dir(s.write(tmp_path / "p" / "s.jsonl").parent.parent)
    msgs = rendered(res, res.states.to_pylist()[-1])
    tools = [(m["tool_call_id"], m["content"]) for m in msgs if m["role"] == "tool"]
    assert tools == [("t1", "A"), ("t2", "B"), ("t3", INTERRUPTED)]
    users = [m["content"] for m in msgs if m["role"] == "user"]
    assert any("orphan output" in u for u in users) and users[-1].startswith("[Request interrupted")


def test_6_content_shapes_and_error_strings(tmp_path):
    s = Session()
    s.user(
        [
            text("look at this"),
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
        ]
    )
    s.assistant(tool("Read", "t1", file_path="a"), tool("Edit", "t2", file_path="a"), tool("Bash", "t3", command="y"))
    s.result("t1", [text("line 1"), {"type": "image", "source": {}}])  # list content, no is_error key
    s.result("t2", "File has not been read yet", tur="Error: File has not been read yet. Read it first.")
    s.result("t3", "exit 1", is_error=True, tur={"stdout": "", "stderr": "boom"})
    s.assistant(text("hm"))
    res = ingest_dir(s.write(tmp_path / "p" / "s.jsonl").parent.parent)
    st = res.states.to_pylist()
    errs = orjson.loads(st[0]["error_after"])
    assert [(e["tool_use_id"], e["tool_name"]) for e in errs] == [("t2", "Edit"), ("t3", "Bash")] and st[0]["has_error"]
    assert st[1]["error_after"] is None and not st[1]["has_error"]
    msgs = rendered(res, st[1])
    assert msgs[1]["content"] == "look at this\n\n[image]"
    assert msgs[3] == {"role": "tool", "tool_call_id": "t1", "content": "line 1\n[image]"}


def test_7_tree_not_line_order(tmp_path):
    s = Session()
    root = s.user("first question")
    s.assistant(text("answer A"))
    s.user("follow-up on a branch that gets rewound")
    s.assistant(text("answer B"))
    s.user("rewound: ask differently", parent=s.lines and json.loads(s.lines[1])["uuid"])  # back to answer A
    s.assistant(text("answer C"))
    s.user("second root", parent=None)  # another root in the same file
    s.assistant(text("answer D"))
    res = ingest_dir(s.write(tmp_path / "p" / "s.jsonl").parent.parent)
    st = res.states.to_pylist()
    c_msgs = rendered(res, st[2])
    assert [m["content"] for m in c_msgs[1:]] == ["first question", "answer A", "rewound: ask differently"]
    assert [m["content"] for m in rendered(res, st[3])[1:]] == ["second root"]
    assert root


def test_8_three_subagent_layouts_warmup_and_no_double_count(tmp_path):
    proj = tmp_path / "proj"
    sid = "aaaaaaaa-0000-4000-8000-000000000001"
    m = Session(sid, "1.0.98")
    m.user("orchestrate")
    m.assistant(
        tool("Task", "tk_inline", prompt="inline job", description="d"),
        tool("Task", "tk_sib", prompt="sib job"),
        tool("Task", "tk_dir", prompt="dir job"),
    )
    side = Session(sid, "1.0.98", sidechain=True)
    # inline sidechain records inside the main file
    side.lines = m.lines
    side.user("inline job", parent=None)
    side.assistant(text("inline done"))
    m.last = None
    m.rec(
        "progress",
        parent=None,
        data={
            "type": "agent_progress",
            "agentId": "a2c",
            "message": {"type": "assistant", "message": {"id": "copy", "content": [text("dir done")]}},
        },
        parentToolUseID="tk_dir",
    )
    m.result("tk_sib", "sib done", tur={"status": "completed", "agentId": "b1"})
    m.write(proj / f"{sid}.jsonl")
    sib = Session(sid, "2.0.74", agent_id="b1", sidechain=True)
    sib.user("sib job", parent=None)
    sib.assistant(text("sib done"))
    sib.write(proj / "agent-b1.jsonl")
    warm = Session(sid, "2.0.74", agent_id="w1", sidechain=True)
    warm.user("Warmup", parent=None)
    warm.assistant(text("ready"))
    warm.write(proj / "agent-w1.jsonl")
    d = Session(sid, "2.1.38", agent_id="a2c", sidechain=True)
    d.user("dir job", parent=None)
    d.assistant(text("dir done"))
    d.write(proj / sid / "subagents" / "agent-a2c.jsonl")
    (sf,) = discover_sessions(tmp_path)
    assert sf.main_file.name == f"{sid}.jsonl" and len(sf.subagent_files) == 3
    res = ingest_checked(sf, IngestRecipe())
    st = {s["stream_kind"]: s for s in res.states.to_pylist() if s["stream_kind"] != "main"}
    assert {k: (v["parent_tool_use_id"], v["session_id"]) for k, v in st.items()} == {
        "inline_sidechain": ("tk_inline", sid),
        "sibling_agent_file": ("tk_sib", sid),
        "subagents_dir": ("tk_dir", sid),
    }
    assert res.stats["warmup_dropped"] == 1 and res.stats["subagents_linked"] == 3
    # main + 3 subagents; the agent_progress copy is not a state
    assert res.states.num_rows == 4
    # subagent prefixes start at their own prompt
    for s_ in st.values():
        msgs = rendered(res, s_)
        assert msgs[1]["content"].endswith("job") and len(msgs) == 2


def test_9_compaction_after_and_full(tmp_path):
    s = Session()
    s.user("old request")
    s.assistant(text("old answer"))
    pre = s.last
    s.rec(
        "system",
        parent=None,
        subtype="compact_boundary",
        content="Conversation compacted",
        logicalParentUuid=pre,
        compactMetadata={"trigger": "auto", "preTokens": 9000},
    )
    s.user("Summary: old request was answered.", isCompactSummary=True, isVisibleInTranscriptOnly=True)
    s.user("new request")
    s.assistant(text("new answer"))
    s.obj({"type": "summary", "summary": "title", "leafUuid": "elsewhere"})
    res = ingest_dir(s.write(tmp_path / "p" / "s.jsonl").parent.parent)
    st = res.states.to_pylist()[-1]
    after = [m["content"] for m in rendered(res, st)[1:]]
    full = [m["content"] for m in rendered(res, st, compaction="full")[1:]]
    assert after == ["Summary: old request was answered.", "new request"]
    assert full == ["old request", "old answer", "new request"]
    assert res.file_reports[0]["compactions_crossed"] == 1
    full_res = ingest_dir(tmp_path, IngestRecipe.from_dict({"render": {"compaction": "full"}}))
    assert full_res.states.to_pylist()[-1]["n_prefix_messages"] == 4


def test_10_records_without_uuid_timestamp_version(tmp_path):
    s = Session(version="2.0.74")
    s.obj({"type": "summary", "summary": "s", "leafUuid": "x"})
    s.obj({"type": "file-history-snapshot", "messageId": "m", "snapshot": {}, "isSnapshotUpdate": False})
    s.obj({"type": "queue-operation", "operation": "enqueue", "sessionId": "x"})
    s.user("q")
    s.assistant(text("a1"))
    # resumed under a newer version: read per record
    s.version = "2.1.9"
    s.user("q2")
    s.assistant(text("a2"))
    lines = [json.loads(x) for x in s.lines]
    for o in lines[3:5]:
        o.pop("version"), o.pop("timestamp")
    s.lines = [json.dumps(o) for o in lines]
    res = ingest_dir(s.write(tmp_path / "p" / "s.jsonl").parent.parent)
    st = res.states.to_pylist()
    assert [x["version"] for x in st] == [None, "2.1.9"] and st[0]["timestamp"] is None
    assert res.file_reports[0]["no_uuid_records"] == {"summary": 1, "file-history-snapshot": 1, "queue-operation": 1}


def test_11_api_errors_are_not_states(tmp_path):
    s = Session()
    s.user("go")
    s.rec("system", subtype="api_error", error={"status": 529}, retryInMs=500, retryAttempt=1, maxRetries=10)
    s.assistant(text("API Error: overloaded"), model="<synthetic>", isApiErrorMessage=True)
    s.user("retry")
    s.assistant(text("real answer"))
    res = ingest_dir(s.write(tmp_path / "p" / "s.jsonl").parent.parent)
    st = res.states.to_pylist()
    assert len(st) == 1 and action_of(st[0]).text == "real answer"
    assert "API Error" not in json.dumps(rendered(res, st[0]))
    assert "synthetic" in res.messages.column("subtype").to_pylist()  # kept as a message, marked


def test_12_anonymised_and_platform_fields(tmp_path):
    s = Session()
    s.user("hi [REDACTED_EMAIL] in C:\\Users\\me")
    s.assistant(text("hello"))
    lines = [json.loads(x) for x in s.lines]
    lines[0].update(cwd="C:\\Users\\me\\proj", gitBranch="")
    lines[1].pop("cwd")
    lines[1]["slug"] = None
    s.lines = [json.dumps(o) for o in lines]
    res = ingest_dir(s.write(tmp_path / "p" / "s.jsonl").parent.parent)
    (st,) = res.states.to_pylist()
    assert rendered(res, st)[1]["content"] == "hi [REDACTED_EMAIL] in C:\\Users\\me"


def test_odd_values_never_abort_the_ingest(tmp_path):
    """Valid JSON that the readers take but Python chokes on used to abort the whole ingest: an integer
    beyond 64 bits in a tool input or usage (orjson cannot write it), a non-string tool_use_id (not
    hashable), nesting deeper than msgspec's recursion limit, a number beyond float range inside a kept
    payload. And a JSON key named like a bookkeeping field must not set it."""
    s = Session()
    s.user("go")
    s.assistant(tool("Bash", "t1", command="echo", n=2**70))
    s.result("t1", [{"type": "text", "text": "boom"}], is_error=True)
    s.user([{"type": "tool_result", "tool_use_id": {"not": "hashable"}, "content": "x"}])
    s.assistant(text("after"), tool("Read", "t2", file_path="a.py"))
    u = uid()
    s.raw(
        '{"type":"user","uuid":"%s","parentUuid":"%s","message":{"role":"user","content":[{"type":"tool_result",'
        '"tool_use_id":"t2","is_error":true,"content":[1e400]}]}}' % (u, s.last)
    )
    forged = uid()
    s.raw(
        '{"type":"user","uuid":"%s","parentUuid":"%s","@damaged":true,"message":{"role":"user","content":"hi"}}'
        % (forged, u)
    )
    s.last = forged
    s.raw('{"type":"user","uuid":"%s","x":%s}' % (uid(), "[" * 3000 + "]" * 3000))
    s.assistant(text("end"))
    res = ingest_dir(s.write(tmp_path / "p" / "s.jsonl").parent.parent)
    states = res.states.to_pylist()
    call = json.loads(states[0]["action"])["tool_calls"][0]
    # written exactly, by the standard library
    assert call["arguments"]["n"] == 2**70
    assert states[0]["has_error"] and "boom" in states[0]["error_after"]
    msgs = {m["uuid"]: m for m in res.messages.to_pylist()}
    assert msgs[forged]["record_type"] == "user" and msgs[forged]["message_key"] is None
    (q,) = res.quarantine.to_pylist()
    assert q["reason"].startswith("invalid JSON: depth limit exceeded") and q["line_no"] == 9
    assert len(states) == 3
    # the result whose payload cannot be decoded is still an error, with no text
    assert json.loads(states[1]["error_after"]) == [{"tool_use_id": "t2", "tool_name": "Read", "content": ""}]
