"""Teachers as the providers are today (issue 34, "2. The providers' rules"), against the loopback provider
emulator with current models' request rules (tests/support/provider_emulator.py: ``reasoning``,
``sampling=False``, scripted stop reasons and refusals): temperature only when set and in the protocol's
range, ``max_completion_tokens`` for OpenAI reasoning models, a 400 naming an unsupported parameter retried
once without it (remembered for the run), stop reasons recorded, cut answers kept out of the votes,
refusals kept with their text, and the cache minimums of each Claude family in the cost prediction."""

from __future__ import annotations

import logging

import pytest

from composer_pipeline.ledger import Ledger
from composer_pipeline.replay.call import unsupported_param
from composer_pipeline.replay.plan import predict_cached
from composer_pipeline.replay.requests import make_request
from composer_pipeline.replay.run import replay_requests
from composer_pipeline.teachers import anthropic
from composer_pipeline.teachers.cache import ResponseCache
from composer_pipeline.teachers.config import parse_teachers
from composer_pipeline.teachers.pricing import billed
from composer_pipeline.teachers.server import chat_message, stop_strings, unsupported_params
from tests.support.provider_emulator import ModelRules, ProviderEmulator

KEY = "sk-ant-emulated-key"
TOOLS = [{"type": "function", "function": {"name": "Read", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture
def emu():
    srv = ProviderEmulator(
        {
            "claude-opus-4-8": ModelRules("anthropic", 200_000, 5.0, 25.0, 0.5, 6.25, sampling=False),
            "gpt-5-mini": ModelRules("openai", 128_000, 0.25, 2.0, 0.025, reasoning=True),
            "reasoner": ModelRules("openai", 128_000, 0.25, 2.0, 0.025, reasoning=True),  # a name no rule knows
            "gpt": ModelRules("openai", 128_000, 2.0, 8.0, 0.2),
            "claude": ModelRules("anthropic", 200_000, 3.0, 15.0, 0.3, 3.75),
        },
        api_key=KEY,
    ).start()
    yield srv
    srv.stop()


def teacher(url: str, model: str, api: str = "openai", name: str | None = None, **over) -> dict:
    d = dict(
        name=name or model,
        base_url=url,
        model=model,
        api=api,
        api_key_env="EMU_KEY" if api == "anthropic" else None,
        input_usd_per_mtok=1.0,
        output_usd_per_mtok=2.0,
        budget_usd=5.0,
        max_concurrency=1,
        max_tokens=64,
        timeout_s=10.0,
        max_retries=2,
        backoff_s=0.01,
        backoff_max_s=0.02,
    )
    d.update(over)
    return d


def run(emu, teachers: list[dict], states: int = 1, tmp_path=None, ledger_url=None):
    cfg = parse_teachers({"ceiling_usd": 5.0, "teachers": teachers}, "test")
    reqs = []
    for i in range(states):
        msgs = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": f"task {i}"}]
        reqs += [make_request(f"s{i}", "sess", t, msgs, TOOLS) for t in cfg.teachers]
    led = Ledger(ledger_url or str(tmp_path / "ledger.sqlite"))
    res = replay_requests(
        reqs, cfg, {t.name: KEY for t in cfg.teachers}, cache=ResponseCache(tmp_path / "c"), ledger=led, run_id="r"
    )
    return cfg, res, led


# --- temperature ---------------------------------------------------------------------------------------------
def test_a_teacher_without_temperature_sends_none(emu, tmp_path):
    cfg, res, _ = run(emu, [teacher(emu.url, "claude-opus-4-8", "anthropic")], tmp_path=tmp_path)
    assert "temperature" not in cfg.teachers[0].request_params()
    assert [r["status"] for r in res.table.to_pylist()] == ["answered"]
    assert len(emu.requests) == 1 and "temperature" not in emu.requests[0].body


@pytest.mark.parametrize(
    ("api", "value", "ok"),
    [("anthropic", 1.5, False), ("anthropic", 1.0, True), ("openai", 2.5, False), ("openai", 1.5, True)],
)
def test_out_of_range_temperature_is_a_load_error_naming_the_teacher(api, value, ok):
    data = {
        "ceiling_usd": 1.0,
        "teachers": [
            teacher(
                "http://127.0.0.1:9/v1",
                "m",
                api,
                name="named-t",
                temperature=value,
                # the API version that still takes a temperature (2026-10-21 takes none: tested below)
                **({"anthropic_version": "2023-06-01"} if api == "anthropic" else {}),
            )
        ],
    }
    if ok:
        assert parse_teachers(data, "t.yaml").teachers[0].request_params()["temperature"] == value
        return
    with pytest.raises(ValueError, match=r"\(named-t\): temperature must be in \[0, [12]\] for api: " + api):
        parse_teachers(data, "t.yaml")


# --- OpenAI reasoning models ------------------------------------------------------------------------------------
def test_reasoning_models_get_max_completion_tokens(emu, tmp_path):
    cfg, res, led = run(emu, [teacher(emu.url, "gpt-5-mini")], tmp_path=tmp_path)
    params = cfg.teachers[0].request_params()
    assert params == {"max_completion_tokens": 64}
    assert [r["status"] for r in res.table.to_pylist()] == ["answered"] and len(emu.requests) == 1
    body = emu.requests[0].body
    assert body["max_completion_tokens"] == 64 and "max_tokens" not in body
    for model in ("o1", "o3-mini", "o4-mini-2025-04-16", "gpt-5", "gpt-5.1", "openai/gpt-5-nano"):
        assert (
            parse_teachers({"ceiling_usd": 1, "teachers": [teacher("http://h/v1", model, name="x")]})
            .teachers[0]
            .max_tokens_param
            == "max_completion_tokens"
        ), model
    for model in ("gpt-4o", "gpt-4.1-mini", "claude-sonnet-4-6", "o"):
        assert (
            parse_teachers({"ceiling_usd": 1, "teachers": [teacher("http://h/v1", model, name="x")]})
            .teachers[0]
            .max_tokens_param
            == "max_tokens"
        ), model


# --- a 400 naming an unsupported parameter ---------------------------------------------------------------------
def test_an_unsupported_parameter_is_dropped_once_and_remembered_for_the_run(emu, ledger_url, tmp_path, caplog):
    """A model the rules do not know refuses max_tokens, then temperature 0: each 400 (not billed) is retried
    once without the parameter (max_tokens renamed, never dropped), logged once; later states never send it."""
    caplog.set_level(logging.WARNING, logger="composer_pipeline.replay.call")
    _, res, led = run(
        emu,
        [teacher(emu.url, "reasoner", temperature=0.0, max_retries=0)],
        states=3,
        tmp_path=tmp_path,
        ledger_url=ledger_url,
    )
    rows = res.table.to_pylist()
    assert [r["status"] for r in rows] == ["answered"] * 3, [r["reason"] for r in rows]
    assert [s.status for s in emu.requests] == [400, 400, 200, 200, 200]
    assert [
        sorted(k for k in s.body if k in ("max_tokens", "max_completion_tokens", "temperature")) for s in emu.requests
    ] == [
        ["max_tokens", "temperature"],
        ["max_completion_tokens", "temperature"],
        ["max_completion_tokens"],
        ["max_completion_tokens"],
        ["max_completion_tokens"],
    ]
    logged = [r.getMessage() for r in caplog.records if "refuses" in r.getMessage()]
    assert len(logged) == 2 and "max_tokens" in logged[0] and "temperature" in logged[1]
    # the 400s were released: the ledger holds what the emulator billed
    assert led.balance("reasoner", 5.0).spent_usd == pytest.approx(sum(r["cost_usd"] for r in rows))
    assert led.balance("reasoner", 5.0).kept_calls == 0


def test_anthropic_deprecated_temperature_is_retried_without_it(emu, tmp_path):
    _, res, _ = run(
        emu,
        [teacher(emu.url, "claude-opus-4-8", "anthropic", temperature=0.5, anthropic_version="2023-06-01")],
        states=2,
        tmp_path=tmp_path,
    )
    assert [r["status"] for r in res.table.to_pylist()] == ["answered", "answered"]
    assert [s.status for s in emu.requests] == [400, 200, 200]
    assert ["temperature" in s.body for s in emu.requests] == [True, False, False]


@pytest.mark.parametrize("param", ["temperature", "top_p"])
def test_the_current_anthropic_version_takes_no_sampling_parameter(param):
    """anthropic-version 2026-10-21 (the default) removed temperature/top_p/top_k: a 400 even at the default
    value, so setting one is a load error naming the teacher and the way out; without one nothing is sent."""
    data = {"ceiling_usd": 1.0, "teachers": [teacher("http://h/v1", "claude", "anthropic", name="named-t")]}
    t = parse_teachers(data, "t.yaml").teachers[0]
    assert t.anthropic_version == "2026-10-21" and "temperature" not in t.request_params()
    data["teachers"][0][param] = 0.5
    with pytest.raises(ValueError, match=rf"\(named-t\): {param} cannot be sent with anthropic_version 2026-10-21"):
        parse_teachers(data, "t.yaml")
    data["teachers"][0]["anthropic_version"] = "2023-06-01"
    assert parse_teachers(data, "t.yaml").teachers[0].request_params()[param] == 0.5


def test_a_400_naming_nothing_it_can_change_is_not_retried(emu, tmp_path):
    emu.inject.append((400, {}))
    _, res, _ = run(emu, [teacher(emu.url, "gpt", temperature=0.0)], tmp_path=tmp_path)
    row = res.table.to_pylist()[0]
    assert row["status"] == "failed" and row["attempts"] == 1 and len(emu.requests) == 1
    # a 400 that names a parameter the request did not send, or one it cannot do without, is not retried either
    said = b'{"error": {"code": "unsupported_parameter", "param": "top_k", "message": "top_k is not supported"}}'
    assert unsupported_param(said, {"model": "m", "temperature": 0}, "openai") is None
    said = b'{"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens is not supported"}}'
    assert unsupported_param(said, {"max_tokens": 5}, "anthropic") is None
    said = b'{"type": "error", "error": {"type": "invalid_request_error", "message": "temperature is deprecated for this model."}}'
    assert unsupported_param(said, {"max_tokens": 5, "temperature": 0}, "anthropic") == "temperature"
    # an OpenAI-compatible server that refuses prompt_cache_key (providers.md): dropped, never the other fields
    said = b'{"error": {"message": "Unrecognized request argument supplied: prompt_cache_key"}}'
    assert unsupported_param(said, {"max_tokens": 5, "prompt_cache_key": "cp-1"}, "openai") == "prompt_cache_key"
    said = b'{"error": {"message": "Invalid value for temperature: must be between 0 and 2"}}'
    assert unsupported_param(said, {"temperature": 3}, "openai") is None


# --- stop reasons and refusals ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("model", "api", "cut"), [("gpt", "openai", "length"), ("claude", "anthropic", "max_tokens")])
def test_stop_reasons_are_recorded_and_a_cut_answer_is_marked(emu, tmp_path, model, api, cut):
    emu.script.append({"stop": cut})
    _, res, _ = run(emu, [teacher(emu.url, model, api)], states=2, tmp_path=tmp_path)
    rows = sorted(res.table.to_pylist(), key=lambda r: r["state_id"])
    assert [r["finish_reason"] for r in rows] == [cut, "tool_calls" if api == "openai" else "tool_use"]
    assert rows[0]["status"] == "answered" and rows[0]["reason"].startswith("cut_off")
    assert rows[1]["reason"] is None
    assert res.summary["cut_answers"] == 1


@pytest.mark.parametrize(("model", "api"), [("gpt", "openai"), ("claude", "anthropic")])
def test_a_refusal_keeps_its_text(emu, tmp_path, model, api):
    emu.script.append({"refusal": "I can't help with that request."})
    _, res, led = run(emu, [teacher(emu.url, model, api)], tmp_path=tmp_path)
    row = res.table.to_pylist()[0]
    assert row["status"] == "refused" and row["raw_answer"] == "I can't help with that request."
    assert row["finish_reason"] == ("refusal" if api == "anthropic" else "stop") and row["action"] is None
    assert res.summary["refused"] == 1
    # paid for: kept in the ledger as an answer, never bought again
    _, again, _ = run(emu, [teacher(emu.url, model, api)], tmp_path=tmp_path)
    assert again.table.to_pylist()[0]["status"] == "refused" and len(emu.requests) == 1


# --- caching prices per model family ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("model", "floor"),
    [
        ("claude-haiku-4-5-20251001", 4096),
        ("claude-opus-4-5", 4096),
        ("anthropic/claude-opus-4.6", 4096),
        ("claude-sonnet-4-6", 2048),
        ("claude-opus-4-7", 2048),
        ("claude-sonnet-4-5", 1024),
        ("claude-3-7-sonnet-latest", 1024),
    ],
)
def test_cache_minimums_per_model_family_in_the_prediction(model, floor):
    assert anthropic.min_cached_tokens(model) == floor
    cfg = parse_teachers(
        {
            "ceiling_usd": 1,
            "teachers": [teacher("http://h/v1", model, "anthropic", name="t", cached_input_usd_per_mtok=0.1)],
        }
    )
    t = cfg.teachers[0]
    # a stream of two states whose shared prefix is ~3,000 tokens (at the prediction's 4 bytes per token)
    first = [{"role": "system", "content": "s"}, {"role": "user", "content": "x" * 12_000}]
    second = first + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]
    reqs = [make_request(f"s{i}", "sess", t, m, None, stream_id="st", order=i) for i, m in enumerate((first, second))]
    full = predict_cached([reqs[1]])[0]  # alone: nothing to read
    cached = predict_cached(reqs)[1]
    assert (cached < full / 2) == (floor < 3000), (model, cached, full)


def test_one_hour_cache_writes_are_billed_at_twice_the_input_price():
    t = parse_teachers(
        {
            "ceiling_usd": 1,
            "teachers": [
                teacher(
                    "http://h/v1",
                    "claude",
                    "anthropic",
                    input_usd_per_mtok=3.0,
                    cache_write_usd_per_mtok=3.75,
                    output_usd_per_mtok=15.0,
                )
            ],
        }
    ).teachers[0]
    usage = {
        "input_tokens": 100,
        "output_tokens": 10,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 3000,
        "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2000},
    }
    b = billed(usage, t)
    assert b.cache_write_1h_tokens == 2000
    assert b.usd == pytest.approx((100 * 3.0 + 1000 * 3.75 + 2000 * 6.0 + 10 * 15.0) / 1e6)
    # the same through the native answer mapping (what call_teacher settles)
    answer = {"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "usage": usage}
    assert billed(anthropic.to_chat_completion(answer)["usage"], t).usd == pytest.approx(b.usd)


# --- the local teacher server's OpenAI surface (its model-free parts; the served model: test_local_server.py) ----
def test_local_server_answers_tool_calls_in_openai_shape_and_refuses_what_it_does_not_support():
    text = 'Reading it.\n<tool_call>\n{"name": "Read", "arguments": {"file_path": "/a.py"}}\n</tool_call>'
    message, finish = chat_message(text, "stop")
    assert finish == "tool_calls" and message["content"] == "Reading it."
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "Read", "arguments": '{"file_path":"/a.py"}'}
    assert chat_message(text, "length")[1] == "length"
    assert chat_message("plain answer", "stop") == ({"role": "assistant", "content": "plain answer"}, "stop")
    broken = "<tool_call>{not json</tool_call>"
    assert chat_message(broken, "stop") == ({"role": "assistant", "content": broken}, "stop")
    assert unsupported_params({"model": "m", "messages": [], "logprobs": True, "tool_choice": "required"}) == [
        "logprobs",
        "tool_choice",
    ]
    assert stop_strings({"stop": "\n"}) == ["\n"] and stop_strings({}) == []
    for bad in (["a"] * 5, [""], 3):
        with pytest.raises(ValueError, match="stop must be"):
            stop_strings({"stop": bad})
    assert unsupported_params({"model": "m", "stream": False, "tool_choice": "auto", "n": 2}) == []


# --- is_error reaches Claude ------------------------------------------------------------------------------------
def test_a_failed_tool_result_reaches_claude_as_is_error(samples_tables):
    """The shipped sample sessions hold failed tool results (``is_error: true``): Claude's ``tool_result``
    blocks say so; OpenAI-style teachers get their standard tool messages; the call ids do not change."""
    from composer_pipeline.render import Conversation, render_state
    from composer_pipeline.replay.call import wire_body
    from composer_pipeline.teachers.cache import call_id

    states, messages = samples_tables
    conv = Conversation.from_table(messages)
    cfg = parse_teachers(
        {"ceiling_usd": 1, "teachers": [teacher("http://h", "claude", "anthropic"), teacher("http://h/v1", "gpt")]}
    )
    claude, gpt = cfg.teachers
    seen = 0
    for row in states.to_pylist():
        rs = render_state(conv, row)
        marked = [m for m in rs.messages if m.get("is_error")]
        if not marked:
            continue
        seen += 1
        body = make_request(row["state_id"], None, claude, rs.messages, rs.tools).body
        blocks = [b for m in wire_body(claude, body)["messages"] for b in m["content"] if b["type"] == "tool_result"]
        assert sum(b.get("is_error") is True for b in blocks) == len(marked)
        assert all(m["role"] == "tool" for m in marked)
        openai_body = wire_body(gpt, make_request(row["state_id"], None, gpt, rs.messages, rs.tools).body)
        assert not any("is_error" in m for m in openai_body["messages"])
        unmarked = {**body, "messages": [{k: v for k, v in m.items() if k != "is_error"} for m in body["messages"]]}
        assert call_id("c", "m", body) == call_id("c", "m", unmarked)
    assert seen > 0
