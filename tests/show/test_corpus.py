"""`show --json` over every state of each corpus (ours; the real one when named): the prefix is a
well-formed OpenAI chat, every tool call is answered once (or marked interrupted), and the order
follows the parentUuid chain."""

from __future__ import annotations

import orjson
import pytest

from composer_pipeline.render import INTERRUPTED, record_payload
from composer_pipeline.show import StateView, view_from_dict
from composer_pipeline.store import Store

from .conftest import cli


@pytest.fixture(scope="module")
def views(corpus_store) -> list[dict]:
    rc, out, err = cli("show", "--all", "--store", corpus_store, "--json")
    assert rc == 0, err
    return [orjson.loads(line) for line in out.splitlines()]


@pytest.fixture(scope="module")
def messages_of(corpus_store) -> list[dict]:
    rows = Store(str(corpus_store)).read_table("trace_messages").to_pylist()
    for r in rows:  # the payload is stored once, inside raw
        r["content"] = record_payload(r["raw"], r["record_type"])[0]
    return rows


def check_tool_answers(prefix: list[dict]) -> dict[str, int]:
    """Every assistant tool call is answered right after it by exactly one tool message; counts."""
    counts = {"calls": 0, "interrupted": 0, "parallel": 0}
    i = 0
    while i < len(prefix):
        m = prefix[i]
        assert m["role"] in ("system", "user", "assistant", "tool"), m
        assert m["role"] != "tool", f"tool message {i} answers no preceding call: {m}"
        i += 1
        if m["role"] != "assistant":
            assert isinstance(m["content"], str) and m["content"], m
            continue
        calls = [c["id"] for c in m.get("tool_calls") or []]
        assert len(set(calls)) == len(calls)
        for c in m.get("tool_calls") or []:
            assert c["type"] == "function" and isinstance(orjson.loads(c["function"]["arguments"]), dict)
        answers = []
        while i < len(prefix) and prefix[i]["role"] == "tool":
            answers.append(prefix[i])
            i += 1
        assert [a["tool_call_id"] for a in answers] == calls, "each call answered exactly once, in call order"
        assert all(isinstance(a["content"], str) for a in answers)
        counts["calls"] += len(calls)
        counts["interrupted"] += sum(a["content"] == INTERRUPTED for a in answers)
        counts["parallel"] += len(calls) > 1
    return counts


def test_every_state_renders_and_every_call_is_answered(views, corpus):
    assert len(views) == corpus.expect["total_states"]
    kinds = {v["stream_kind"] for v in views}
    assert kinds == set(corpus.expect["kinds"])
    total = {"calls": 0, "interrupted": 0, "parallel": 0}
    for v in views:
        for k in ("state_id", "source_file", "source_lines", "prefix", "action", "error_after", "teachers"):
            assert k in v, k
        assert v["prefix"][0]["role"] == "system" and len(v["prefix"]) >= 2
        assert v["prefix"][1]["role"] == "user", "a conversation starts with its prompt"
        assert v["source_file"].endswith(".jsonl") and v["source_lines"]
        for k, n in check_tool_answers(v["prefix"]).items():
            total[k] += n
        assert v["teachers"] == [] and v["replayed"] is False
        assert "teacher_replays: table not stored (not replayed yet)" in v["missing"]
    assert total["calls"] > corpus.expect["min_tool_calls"] and total["parallel"] > corpus.expect["min_parallel_calls"]


def test_order_follows_parent_uuid_chain(views, messages_of, corpus_store, corpus):
    """Assistant messages appear in chain order: mapped back to their message_key via tool-call ids, the
    sequence equals the chain's order of tool-using responses (walked here independently of render.py)."""
    by_stream: dict[str, dict[str, dict]] = {}
    key_of_call: dict[str, str] = {}
    for r in messages_of:
        by_stream.setdefault(r["stream_id"], {}).setdefault(r["uuid"], r)
        if r["record_type"] == "assistant" and r["content"]:
            for b in r["content"]:
                if isinstance(b, dict) and b.get("type") == "tool_use":
                    key_of_call[b["id"]] = r["message_key"]
    states = {s["state_id"]: s for s in Store(str(corpus_store)).read_table("trace_states").to_pylist()}
    checked = crossing_progress = 0
    for v in views:
        st = states[v["state_id"]]
        recs = by_stream[st["stream_id"]]
        chain, u = [], st["prefix_leaf_uuid"]
        while u and u in recs and recs[u]["subtype"] != "compact_boundary":
            chain.append(recs[u])
            u = recs[u]["parent_uuid"]
        chain.reverse()
        crossing_progress += any(r["record_type"] == "progress" for r in chain)
        own = st["message_id"] or st["request_id"]
        expected = []
        for r in chain:
            if r["record_type"] == "assistant" and r["message_key"] != own and r["message_key"] not in expected:
                blocks = r["content"] or []
                if any(isinstance(b, dict) and b.get("type") == "tool_use" for b in blocks):
                    expected.append(r["message_key"])
        got = []
        for m in v["prefix"]:
            if m["role"] == "assistant" and m.get("tool_calls"):
                keys = {key_of_call[c["id"]] for c in m["tool_calls"]}
                assert len(keys) == 1, "one assistant message = one API response"
                got.append(keys.pop())
        assert got == expected, v["state_id"]
        # the user messages are the chain's user texts, in chain order (meta records skipped)
        checked += 1
    assert (
        checked == corpus.expect["total_states"] and crossing_progress > 0
        # 2.1.x chains run through progress records
    )


def test_list_tool_results_are_flattened_text(views, messages_of):
    list_results = {}
    for r in messages_of:
        if r["record_type"] == "user" and isinstance(r["content"], list):
            for b in r["content"]:
                if isinstance(b, dict) and b.get("type") == "tool_result" and isinstance(b.get("content"), list):
                    list_results[b["tool_use_id"]] = [x.get("text") for x in b["content"] if x.get("type") == "text"]
    assert list_results
    seen = 0
    for v in views:
        for m in v["prefix"]:
            if m["role"] == "tool" and m["tool_call_id"] in list_results:
                seen += 1
                for text in list_results[m["tool_call_id"]]:
                    assert text in m["content"]
    assert seen > 0


def test_subagent_prefix_starts_at_its_own_prompt(views, messages_of, corpus):
    """Inline 1.0.x sidechains and agent files: the first user message is the prompt the parent's Task
    call gave the subagent, never the parent session's opening (a compaction worker has no Task call)."""
    task_prompt = {}
    for r in messages_of:
        if r["record_type"] == "assistant" and r["content"]:
            for b in r["content"]:
                if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("name") in ("Task", "Agent"):
                    task_prompt[b["id"]] = b["input"].get("prompt")
    mains = {v["session_key"]: v["prefix"][1]["content"] for v in views if v["stream_kind"] == "main"}
    n = unlinked = 0
    for v in views:
        if v["stream_kind"] == "main":
            continue
        first_user = v["prefix"][1]["content"]
        assert first_user != mains.get(v["session_key"])
        if v["parent_tool_use_id"] is None:
            unlinked += 1
            continue
        assert first_user == task_prompt[v["parent_tool_use_id"]], v["state_id"]
        n += 1
    assert n + unlinked == corpus.expect["total_states"] - corpus.expect["kinds"]["main"]
    assert unlinked == corpus.expect["unlinked_subagent_states"]


def test_json_round_trips(views):
    for d in views[::7]:
        view = view_from_dict(d)
        assert isinstance(view, StateView)
        assert orjson.loads(orjson.dumps(view.to_dict())) == d


def test_terminal_view_of_a_state(views, corpus_store, corpus):
    v = max(views, key=lambda d: sum(len(m.get("tool_calls") or []) > 1 for m in d["prefix"]))
    rc, out, err = cli("show", v["state_id"][:8], "--store", corpus_store, "--width", "120")
    assert rc == 0, err
    assert f"state {v['state_id']}" in out and v["source_file"] in out
    assert "what the agent saw" in out and "what the agent did" in out and "not replayed yet" in out
    call = next(c for m in v["prefix"] if m["role"] == "assistant" for c in m.get("tool_calls") or [])
    assert f"→ {call['function']['name']}(" in out and f"tool ← {call['function']['name']} {call['id']}" in out
    assert "more lines" in out  # long tool results are shortened ...
    rc, full, _ = cli("show", v["state_id"], "--store", corpus_store, "--width", "120", "--full")
    assert "more lines" not in full and len(full) > len(out)  # ... unless --full
    rc, every, err = cli("show", "--all", "--store", corpus_store, "--width", "100")
    assert rc == 0, err
    n = corpus.expect["total_states"]
    assert every.count("━━ state ") == n and every.count("── what the agent did ") == n


def test_thinking_blocks_follow_the_recipe(views, corpus_store, tmp_path):
    assert not any(
        "<thinking>" in (m.get("content") or "") for v in views for m in v["prefix"] if m["role"] == "assistant"
    )
    recipe = tmp_path / "ingest.yaml"
    recipe.write_text("render:\n  strip_thinking: false\n")
    rc, out, err = cli("show", "--all", "--store", corpus_store, "--json", "--recipe", recipe)
    assert rc == 0, err
    kept = [orjson.loads(line) for line in out.splitlines()]
    with_thinking = [v for v in kept if any((m.get("content") or "").startswith("<thinking>") for m in v["prefix"])]
    assert with_thinking and all(v["render"]["strip_thinking"] is False for v in kept)
    # same messages otherwise: thinking is only prepended to assistant text
    for v in with_thinking:
        plain = next(d for d in views if d["state_id"] == v["state_id"])
        assert [m["role"] for m in v["prefix"]] == [m["role"] for m in plain["prefix"]]
