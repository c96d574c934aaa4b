"""Prompt caching priced as providers bill it, session-affine scheduling, the native Anthropic API and
context-window fitting, against the loopback provider emulator (tests/support/provider_emulator.py):
a real HTTP server on 127.0.0.1 with each provider's caching, window and billing rules."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import orjson
import pytest
import yaml
from ledger_helpers import ledger_rows, schema_version

from composer_pipeline.ledger import MIGRATIONS, Ledger
from composer_pipeline.ledger.billing import usage_by_run, usage_by_teacher
from composer_pipeline.replay.plan import plan_requests
from composer_pipeline.replay.requests import make_request
from composer_pipeline.replay.run import replay_requests
from composer_pipeline.teachers import anthropic
from composer_pipeline.teachers.cache import ResponseCache
from composer_pipeline.teachers.config import parse_teachers
from tests.support.provider_emulator import ModelRules, ProviderEmulator

GPT = ModelRules("openai", 128_000, 2.0, 8.0, 0.2)
CLAUDE = ModelRules("anthropic", 200_000, 3.0, 15.0, 0.3, 3.75)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Read",
            "description": "read a file",
            "parameters": {"type": "object", "properties": {"file_path": {}}},
        },
    }
]


@pytest.fixture
def emu():
    srv = ProviderEmulator(
        {"gpt": GPT, "claude": CLAUDE, "gpt-small": ModelRules("openai", 4_000, 0.5, 1.5, 0.05)},
        latency_s=0.05,
        api_key="sk-ant-emulated-key",
    ).start()
    yield srv
    srv.stop()


def teacher(emu, name, model, api="openai", **over) -> dict:
    rules = emu.models[model]
    d = dict(
        name=name,
        base_url=emu.url,
        model=model,
        api_key_env=None,
        api=api,
        input_usd_per_mtok=rules.input_usd_per_mtok,
        output_usd_per_mtok=rules.output_usd_per_mtok,
        cached_input_usd_per_mtok=rules.cached_usd_per_mtok,
        budget_usd=10.0,
        max_concurrency=16,
        max_tokens=64,
        timeout_s=10.0,
        max_retries=3,
        backoff_s=0.01,
        backoff_max_s=0.05,
    )
    if api == "anthropic":
        d["cache_write_usd_per_mtok"] = rules.cache_write_usd_per_mtok
        d["api_key_env"] = "EMU_ANTHROPIC_KEY"
    d.update(over)
    return d


def config(teachers: list[dict], scheduling: str = "stream", ceiling: float = 10.0):
    return parse_teachers({"ceiling_usd": ceiling, "scheduling": scheduling, "teachers": teachers}, "test")


def stream_messages(turns: int, stream: int = 0, result_chars: int = 3000) -> list[list[dict]]:
    """The prefixes of one stream's states: each extends the previous by an assistant call and its result."""
    msgs: list[dict] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"stream {stream}: fix the parser. " + "context " * 700},
    ]
    out = [list(msgs)]
    for t in range(turns):
        cid = f"toolu_{stream}_{t}"
        msgs += [
            {
                "role": "assistant",
                "content": f"step {t}",
                "tool_calls": [
                    {
                        "id": cid,
                        "type": "function",
                        "function": {"name": "Read", "arguments": orjson.dumps({"file_path": f"/f{t}.py"}).decode()},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": cid, "content": f"contents {stream} {t} " + "x" * result_chars},
        ]
        out.append(list(msgs))
    return out


def requests_for(cfg, n_streams: int = 2, turns: int = 6, **kw):
    reqs = []
    for s in range(n_streams):
        for k, msgs in enumerate(stream_messages(turns, s, **kw)):
            for t in cfg.teachers:
                reqs.append(
                    make_request(f"s{s}-{k:03d}", "sess", t, msgs, TOOLS, stream_id=f"sess:stream{s}", order=len(msgs))
                )
    return reqs


def run(cfg, reqs, ledger, cache, run_id="r", keys=None):
    return replay_requests(reqs, cfg, keys or {}, cache=cache, ledger=ledger, run_id=run_id)


def _expected_usd(t, prompt, cached, writes, completion):
    return (
        (prompt - cached - writes) * t.input_usd_per_mtok
        + cached * t.cached_price
        + writes * t.write_price
        + completion * t.output_usd_per_mtok
    ) / 1e6


def test_stream_in_order_hits_and_is_settled_at_cached_price_on_both_ledgers(emu, ledger_url, tmp_path):
    cfg = config([teacher(emu, "gpt", "gpt"), teacher(emu, "claude", "claude", "anthropic")])
    led = Ledger(ledger_url)
    assert schema_version(led) == MIGRATIONS[-1][0] >= 3  # billed_usage is schema version 3
    res = run(cfg, requests_for(cfg), led, ResponseCache(tmp_path / "c"), keys={"claude": "sk-ant-emulated-key"})
    rows = res.table.to_pylist()
    assert {r["status"] for r in rows} == {"answered"} and len(rows) == 2 * 7 * 2
    for name in ("gpt", "claude"):
        t = cfg.teacher(name)
        mine = sorted((r for r in rows if r["teacher"] == name), key=lambda r: r["state_id"])
        # the first state of each stream misses; every later one reads what the previous one wrote
        for r in mine:
            first = r["state_id"].endswith("-000")
            assert (r["cached_tokens"] == 0) == first, (name, r["state_id"], r["cached_tokens"])
            assert r["cost_usd"] == pytest.approx(
                _expected_usd(
                    t, r["prompt_tokens"], r["cached_tokens"], r["cache_write_tokens"] or 0, r["completion_tokens"]
                ),
                rel=1e-9,
            )
        # recorded = what the emulator billed (its own prices and counts); well under full price
        u = usage_by_teacher(led, name)
        assert u["billed_usd"] == pytest.approx(emu.billed_usd(t.model), rel=1e-9)
        assert u["cached_prompt_tokens"] == sum(b.cached_tokens for b in emu.billed if b.model == t.model) > 0
        assert u["full_price_usd"] > 2.5 * u["billed_usd"]
        assert led.balance(name, t.budget_usd).settled_usd == pytest.approx(u["billed_usd"], rel=1e-9)
    assert sum(b.cache_write_tokens for b in emu.billed if b.model == "claude") > 0  # Anthropic writes, billed at 1.25x
    # ... except for the last state of a stream: nothing reads after it, so it only reads (one breakpoint)
    claude_rows = sorted((r for r in rows if r["teacher"] == "claude"), key=lambda r: r["state_id"])
    for r in claude_rows:
        last = r["state_id"].endswith("-006")
        assert (r["cache_write_tokens"] == 0) == last, (r["state_id"], r["cache_write_tokens"])
    last_bodies = [
        s.body
        for s in emu.requests
        if s.path == "/v1/messages"
        and len(s.body["messages"]) == max(len(x.body["messages"]) for x in emu.requests if x.path == "/v1/messages")
    ]
    assert last_bodies and all(
        sum("cache_control" in b for m in body["messages"] for b in m["content"]) == 1
        and "cache_control" not in body["system"][-1]
        for body in last_bodies
    )
    assert usage_by_run(led, "r")["claude"]["cache_write_tokens"] > 0
    assert res.summary["cached_prompt_tokens_by_teacher"]["gpt"] == usage_by_teacher(led, "gpt")["cached_prompt_tokens"]
    # OpenAI-style requests carry prompt_cache_key = a hash of the stream, one per stream
    keys = {s.body.get("prompt_cache_key") for s in emu.requests if s.path.endswith("/chat/completions")}
    assert len(keys) == 2 and all(k.startswith("cp-") and "stream" not in k for k in keys)


def test_same_requests_concurrently_miss(emu, tmp_path):
    """Today's scheduling (every call at once): a stream's requests are in flight together and the cache
    entry of one exists only once it was answered, so they all miss and pay full price."""
    cfg = config([teacher(emu, "gpt", "gpt")], scheduling="all")
    led = Ledger(tmp_path / "l.sqlite")
    # answers take 1 s, so every request of the stream has left before the first is answered, also on a
    # loaded machine (at 0.05 s a late request could read what an earlier one wrote: a hit, not a miss)
    emu.latency_s, latency = 1.0, emu.latency_s
    try:
        res = run(cfg, requests_for(cfg, n_streams=1), led, ResponseCache(tmp_path / "c"))
    finally:
        emu.latency_s = latency
    rows = res.table.to_pylist()
    assert {r["status"] for r in rows} == {"answered"}
    assert all(r["cached_tokens"] == 0 for r in rows)
    u = usage_by_teacher(led, "gpt")
    assert (
        u["billed_usd"]
        == pytest.approx(u["full_price_usd"], rel=1e-9)
        == pytest.approx(emu.billed_usd("gpt"), rel=1e-9)
    )


def test_ttl_expiry_and_refresh(tmp_path):
    emu = ProviderEmulator({"gpt": ModelRules("openai", 128_000, 2.0, 8.0, 0.2, ttl_s=2.0)}).start()
    try:
        cfg = config([teacher(emu, "gpt", "gpt")])
        led, cache = Ledger(tmp_path / "l.sqlite"), ResponseCache(tmp_path / "c")
        prefixes = stream_messages(3)
        t = cfg.teachers[0]

        def one(k):
            r = make_request(f"s{k}", "sess", t, prefixes[k], TOOLS, stream_id="sess:main", order=k)
            return run(cfg, [r], led, cache, run_id=f"r{k}").table.to_pylist()[0]

        assert one(0)["cached_tokens"] == 0
        assert one(1)["cached_tokens"] > 0  # within the TTL
        # (a 2 s TTL: one run may take a second on a loaded machine)
        time.sleep(2.5)
        assert one(2)["cached_tokens"] == 0  # the entries expired
    finally:
        emu.stop()


def test_anthropic_wire_format_and_same_actions(emu, tmp_path):
    cfg = config([teacher(emu, "claude", "claude", "anthropic"), teacher(emu, "gpt", "gpt")])
    res = run(
        cfg,
        requests_for(cfg, n_streams=1, turns=3),
        Ledger(tmp_path / "l.sqlite"),
        ResponseCache(tmp_path / "c"),
        keys={"claude": "sk-ant-emulated-key"},
    )
    rows = res.table.to_pylist()
    assert {r["status"] for r in rows} == {"answered"}
    native = [s for s in emu.requests if s.path == "/v1/messages"]
    assert len(native) == 4
    for s in native:
        assert s.headers["x-api-key"] == "sk-ant-emulated-key" and s.headers["anthropic-version"] == "2026-10-21"
        assert "authorization" not in s.headers and "seed" not in s.body
        n_bp = sum(
            "cache_control" in b
            for b in s.body.get("system", []) + [b for m in s.body["messages"] for b in m["content"]]
        )
        assert 1 <= n_bp <= 4
        assert s.body["tools"][0]["input_schema"]["type"] == "object" and s.body["system"][0]["type"] == "text"
    # the Anthropic answer's tool_use blocks and the OpenAI-style answer's tool_calls are the same action
    by_state: dict = {}
    for r in rows:
        by_state.setdefault(r["state_id"], {})[r["teacher"]] = orjson.loads(r["action"])
    for acts in by_state.values():
        assert (
            [(c["name"], c["arguments"]) for c in acts["claude"]["tool_calls"]]
            == [(c["name"], c["arguments"]) for c in acts["gpt"]["tool_calls"]]
            == [("Read", {"file_path": "/repo/README.md"})]
        )


def test_anthropic_overloaded_and_rate_limited_are_retried_unbilled(emu, tmp_path):
    cfg = config([teacher(emu, "claude", "claude", "anthropic", max_concurrency=1)])
    # overloaded_error, then rate_limit_error with retry-after
    emu.inject += [(529, {}), (429, {"retry-after": "0"})]
    led = Ledger(tmp_path / "l.sqlite")
    res = run(
        cfg,
        requests_for(cfg, n_streams=1, turns=1),
        led,
        ResponseCache(tmp_path / "c"),
        keys={"claude": "sk-ant-emulated-key"},
    )
    rows = res.table.to_pylist()
    assert {r["status"] for r in rows} == {"answered"} and sum(r["attempts"] for r in rows) == len(rows) + 2
    notes = sorted((r["state"], (r["note"] or "")[:8]) for r in ledger_rows(led) if r["state"] != "settled")
    assert notes == [("released", "http_429"), ("released", "http_529")]
    assert led.balance("claude", 10.0).settled_usd == pytest.approx(emu.billed_usd("claude"), rel=1e-9)


def test_breakpoint_limit(emu):
    """Ours never places more than four breakpoints; the emulator, as Anthropic does, refuses a fifth."""
    cfg = config([teacher(emu, "claude", "claude", "anthropic")])
    body = anthropic.to_messages_request(requests_for(cfg, n_streams=1, turns=60)[-1].body)
    blocks = body["system"] + [b for m in body["messages"] for b in m["content"]]
    assert sum("cache_control" in b for b in blocks) == 4
    for b in blocks[:5]:
        b["cache_control"] = {"type": "ephemeral"}
    r = httpx.post(
        emu.url + "/messages",
        json=body,
        headers={"x-api-key": "sk-ant-emulated-key", "anthropic-version": "2026-10-21"},
    )
    assert r.status_code == 400 and "maximum of 4 blocks with cache_control" in r.json()["error"]["message"]


def test_anthropic_every_call_answered_once():
    msgs = stream_messages(4)[-1] + [{"role": "user", "content": "go on"}]
    system, out = anthropic.convert_messages(msgs)
    assert [m["role"] for m in out] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    for a, u in zip(out[1::2], out[2::2]):
        uses = [b["id"] for b in a["content"] if b["type"] == "tool_use"]
        results = [b["tool_use_id"] for b in u["content"] if b["type"] == "tool_result"]
        assert uses == results


def test_window_fit_refit_and_over_context_window(tmp_path):
    """The teacher's tokenizer counts more tokens than the fit's ratio: the first fitted request is refused
    (not billed), one tighter refit is answered; a provider that counts even more gets the state skipped."""
    for bpt, expect in ((2.5, "answered"), (1.2, "over_context_window")):
        emu = ProviderEmulator({"gpt-small": ModelRules("openai", 6_000, 0.5, 1.5, 0.05, bytes_per_token=bpt)}).start()
        try:
            cfg = config([teacher(emu, "small", "gpt-small", context_window=6_000)])
            led = Ledger(tmp_path / f"l{bpt}.sqlite")
            reqs = requests_for(cfg, n_streams=1, turns=12, result_chars=2500)
            res = run(cfg, reqs, led, ResponseCache(tmp_path / f"c{bpt}"))
            rows = {r["state_id"]: r for r in res.table.to_pylist()}
            last = rows[max(rows)]
            assert last["elided_messages"] > 0
            if expect == "answered":
                assert {r["status"] for r in rows.values()} == {"answered"}
                assert emu.over_window  # the first fit was refused ...
                assert all(b.prompt_tokens + 64 <= 6_000 for b in emu.billed)  # ... never billed
            else:
                assert last["status"] == "failed" and last["reason"].startswith("over_context_window: refitted once")
            refused = [r for r in ledger_rows(led) if (r["note"] or "").startswith("context_length_exceeded")]
            assert refused and all(r["state"] == "released" for r in refused)
            assert res.summary["over_context_window"] == (
                0
                if expect == "answered"
                else sum(
                    r["reason"] is not None and r["reason"].startswith("over_context_window") for r in rows.values()
                )
            )
        finally:
            emu.stop()


def test_fitted_requests_never_exceed_the_window(emu, tmp_path):
    """At the emulator's 4 bytes per token the conservative fit (3.0) sends nothing over a window."""
    cfg = config([teacher(emu, "small", "gpt-small", context_window=4_000)])
    res = run(
        cfg, requests_for(cfg, n_streams=2, turns=15), Ledger(tmp_path / "l.sqlite"), ResponseCache(tmp_path / "c")
    )
    assert {r["status"] for r in res.table.to_pylist()} == {"answered"}
    assert emu.over_window == [] and res.summary["fitted_answers"] > 0


def test_binding_budget_never_exceeded_with_caching(emu, ledger_url, tmp_path):
    """Reservations stay at the full-price worst case: a budget that binds is never exceeded, and what is
    settled is what the emulator billed."""
    cfg = config([teacher(emu, "gpt", "gpt", budget_usd=0.08, max_concurrency=4)])
    led = Ledger(ledger_url)
    res = run(cfg, requests_for(cfg, n_streams=3, turns=8), led, ResponseCache(tmp_path / "c"))
    statuses = [r["status"] for r in res.table.to_pylist()]
    assert "budget_exhausted" in statuses and "answered" in statuses
    bal = led.balance("gpt", 0.08)
    assert bal.spent_usd <= 0.08 + 1e-12 and bal.reserved_usd == 0
    assert bal.settled_usd == pytest.approx(emu.billed_usd("gpt"), rel=1e-9)


def test_cost_plan_predicts_cached_cost_beside_worst_case(emu, tmp_path):
    cfg = config([teacher(emu, "gpt", "gpt"), teacher(emu, "claude", "claude", "anthropic")])
    reqs = requests_for(cfg)
    led = Ledger(tmp_path / "l.sqlite")
    plan = plan_requests(reqs, cfg, ResponseCache(tmp_path / "c"), led)
    for name in ("gpt", "claude"):
        assert 0 < plan.predicted_by_teacher[name] < plan.worst_case_by_teacher[name] / 4
    res = run(cfg, reqs, led, ResponseCache(tmp_path / "c"), keys={"claude": "sk-ant-emulated-key"})
    billed = usage_by_run(led, "r")
    # the prediction (answers at max_tokens) is of the order of the bill
    for name in ("gpt", "claude"):
        assert billed[name]["billed_usd"] <= plan.predicted_by_teacher[name] <= 3 * billed[name]["billed_usd"]
    assert res.summary["answered"] == len(reqs)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("api", "gemini", r"api must be one of \['openai', 'anthropic'\]"),
        ("cached_input_usd_per_mtok", 5.0, r"cached_input_usd_per_mtok 5 is above input_usd_per_mtok 1"),
        ("context_window", 300, r"context_window 300 is too small for the system prompt plus one turn"),
    ],
)
def test_bad_teacher_keys_exit_2_naming_teacher_and_key(tmp_path, samples_dir, key, value, message):
    import re

    t = dict(
        name="claude-x",
        base_url="http://127.0.0.1:9/v1",
        model="m",
        api_key_env=None,
        input_usd_per_mtok=1.0,
        output_usd_per_mtok=2.0,
        budget_usd=1.0,
        max_concurrency=1,
        max_tokens=64,
    )
    t[key] = value
    p = tmp_path / "t.yaml"
    p.write_text(yaml.safe_dump({"ceiling_usd": 1.0, "teachers": [t]}))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "composer_pipeline",
            "replay",
            "--states",
            str(samples_dir),
            "--teachers",
            str(p),
            "--out",
            str(tmp_path / "o"),
            "--plan-only",
            "--ledger",
            str(tmp_path / "l.sqlite"),
            "--cache",
            str(tmp_path / "c"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "teachers[0] (claude-x)" in r.stderr and re.search(message, r.stderr), r.stderr


@pytest.mark.slow
def test_window_too_small_for_the_rendered_system_prompt_exits_2(tmp_path, samples_dir):
    """The ingest recipe's system prompt (not known when the teachers recipe loads) is checked before any call."""
    t = dict(
        name="small-win",
        base_url="http://127.0.0.1:9/v1",
        model="m",
        api_key_env=None,
        input_usd_per_mtok=1.0,
        output_usd_per_mtok=2.0,
        budget_usd=1.0,
        max_concurrency=1,
        max_tokens=64,
        context_window=1_000,
    )
    p = tmp_path / "t.yaml"
    p.write_text(yaml.safe_dump({"ceiling_usd": 1.0, "teachers": [t]}))
    ingest = tmp_path / "ingest.yaml"
    ingest.write_text(yaml.safe_dump({"render": {"system_prompt": "You are careful. " * 300}}))
    args = [
        sys.executable,
        "-m",
        "composer_pipeline",
        "replay",
        "--states",
        str(samples_dir),
        "--teachers",
        str(p),
        "--out",
        str(tmp_path / "o"),
        "--plan-only",
        "--ledger",
        str(tmp_path / "l.sqlite"),
        "--cache",
        str(tmp_path / "c"),
    ]
    assert subprocess.run(args, capture_output=True, text=True, timeout=120).returncode == 0  # the default prompt fits
    r = subprocess.run(args + ["--ingest-recipe", str(ingest)], capture_output=True, text=True, timeout=120)
    assert (
        r.returncode == 2 and "teachers (small-win): context_window 1000 is too small for the system prompt" in r.stderr
    ), r.stderr
