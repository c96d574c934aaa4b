"""render.fit_messages alone: what fitting a prefix into a window keeps, elides and cuts."""

from __future__ import annotations

import orjson

from composer_pipeline.render import ELIDED_MARKER, count_tokens, fit_messages, min_window


def _prefix(turns: int, result: int = 2000, first_user: int = 500) -> list[dict]:
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task " + "t" * first_user}]
    for t in range(turns):
        calls = [
            {"id": f"c{t}_{j}", "type": "function", "function": {"name": "Read", "arguments": "{}"}} for j in range(2)
        ]
        msgs.append({"role": "assistant", "content": f"step {t}", "tool_calls": calls})
        msgs += [{"role": "tool", "tool_call_id": c["id"], "content": f"r{t} " + "x" * result} for c in calls]
    return msgs


def _tokens(msgs, tools=None) -> int:
    return fit_messages(msgs, tools, 10**9).tokens


def test_fits_untouched_when_small():
    msgs = _prefix(3)
    f = fit_messages(msgs, None, 10**6)
    assert f.messages == msgs and not f.changed


def test_keeps_system_first_user_recent_turns_and_one_marker():
    msgs = _prefix(40)
    budget = 8_000
    f = fit_messages(msgs, None, budget)
    assert f.tokens <= budget and f.tokens == _tokens(f.messages)
    assert f.messages[:2] == msgs[:2]
    assert f.messages[2] == {"role": "user", "content": ELIDED_MARKER.format(n=f.elided)}
    assert sum("elided" in str(m.get("content")) for m in f.messages) == 1
    assert f.messages[3:] == msgs[len(msgs) - len(f.messages) + 3 :]  # the most recent turns, unchanged
    assert len(msgs) - f.elided + 1 == len(f.messages)
    # as many recent turns as fit: one more turn (3 messages) would not
    assert f.tokens + 3 * count_tokens(msgs[-1]) > budget - 200
    # never a tool result without its call, never a call without its results
    calls = {c["id"] for m in f.messages if m.get("tool_calls") for c in m["tool_calls"]}
    results = {m["tool_call_id"] for m in f.messages if m["role"] == "tool"}
    assert calls == results


def test_step_keeps_the_elision_point_for_consecutive_states():
    full = _prefix(60)
    points = []
    for n in range(40, 60):  # consecutive states of one stream
        msgs = full[: 2 + 3 * n]
        f = fit_messages(msgs, None, 30_000, step=8)
        assert f.tokens <= 30_000
        points.append(f.elided)
    # shared elision points: a cacheable prefix across states
    assert len(set(points)) <= 4
    # a window holding fewer turns than the step still keeps as many as fit
    f = fit_messages(full, None, 4_000, step=8)
    assert f.tokens <= 4_000 and len(f.messages) >= 2 + 1 + 3


def test_oversized_single_tool_result_is_cut_in_its_middle():
    msgs = _prefix(2, result=200)
    msgs[-1] = {**msgs[-1], "content": "HEAD" + "y" * 100_000 + "TAIL"}
    f = fit_messages(msgs, None, 6_000)
    assert f.tokens <= 6_000 and f.cut == 1
    cut = f.messages[-1]["content"]
    assert cut.startswith("HEAD") and cut.endswith("TAIL") and "characters cut to fit" in cut
    assert f.messages[-1]["tool_call_id"] == msgs[-1]["tool_call_id"]


def test_oversized_first_user_message_is_cut():
    msgs = _prefix(1, first_user=200_000)
    f = fit_messages(msgs, None, 5_000)
    assert f.tokens <= 5_000 and f.cut >= 1 and f.messages[1]["content"].startswith("task ")


def test_tools_count_and_min_window():
    tools = [
        {"type": "function", "function": {"name": "Read", "parameters": {"type": "object", "properties": {"p": {}}}}}
    ]
    msgs = _prefix(30)
    f = fit_messages(msgs, tools, 6_000)
    assert f.tokens <= 6_000 and f.tokens >= count_tokens(tools) + sum(count_tokens(m) for m in f.messages)
    assert min_window(512) > 512 + count_tokens({"role": "system", "content": "x"})
    assert len(orjson.dumps(f.messages)) < len(orjson.dumps(msgs))


def test_local_teacher_fits_with_its_own_tokenizer(tmp_path, monkeypatch):
    """A locally served teacher (its model in the recipe's `serve`) is fitted with its tokenizer: the fitted
    prefix's real token count (that tokenizer, each message's JSON) is within the window."""
    from tokenizers import Tokenizer

    from composer_pipeline.replay.requests import make_request
    from composer_pipeline.teachers.config import parse_teachers
    from composer_pipeline.teachers.token_count import counter_for, tokenizer_file
    from composer_pipeline.tiny_model import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "tiny")
    cfg = parse_teachers(
        {
            "ceiling_usd": 1.0,
            "serve": {"tiny": str(model_dir)},
            "teachers": [
                dict(
                    name="local",
                    base_url="http://127.0.0.1:1/v1",
                    model="tiny",
                    api_key_env=None,
                    input_usd_per_mtok=0.1,
                    output_usd_per_mtok=0.1,
                    budget_usd=1.0,
                    max_concurrency=1,
                    max_tokens=64,
                    context_window=3_000,
                ),
                dict(
                    name="api",
                    base_url="http://127.0.0.1:1/v1",
                    model="other",
                    api_key_env=None,
                    input_usd_per_mtok=0.1,
                    output_usd_per_mtok=0.1,
                    budget_usd=1.0,
                    max_concurrency=1,
                    max_tokens=64,
                    context_window=3_000,
                ),
            ],
        },
        "t",
    )
    local, api = cfg.teachers
    assert tokenizer_file(cfg, local) == model_dir / "tokenizer.json" and counter_for(cfg, api) is None
    count = counter_for(cfg, local)
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    msgs = _prefix(30, result=600)
    r = make_request("s", "k", local, msgs, None, counter=count)
    assert r.elided_messages > 0
    real = sum(len(tok.encode(orjson.dumps(m).decode(), add_special_tokens=False).ids) + 8 for m in r.body["messages"])
    assert real + 32 <= 3_000 - 64
    # the bytes ratio and the tokenizer disagree: the tokenizer decides for the local teacher
    assert make_request("s", "k", api, msgs, None).elided_messages != r.elided_messages
