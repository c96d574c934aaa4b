"""A provider's usage is not trusted without limit (issue 30, items 4 and 5): absurd, negative and overflowing
token counts from both protocols (OpenAI-compatible and native Anthropic), against the loopback provider
emulator (tests/support/provider_emulator.py, ``script``), on both ledgers.

An honest provider bills no more output than ``max_tokens`` and no more prompt than the request holds: the
settle is clamped at the reservation, the claim and the excess are recorded, the teacher is flagged, and no
other teacher's budget or the run's ceiling is touched. A count of 2**63 or more settles and is stored like
any other answer: a re-run serves it and buys nothing."""

from __future__ import annotations

import pytest
from ledger_helpers import ledger_rows

from composer_pipeline.ledger import Ledger
from composer_pipeline.replay.requests import make_request
from composer_pipeline.replay.run import replay_requests
from composer_pipeline.teachers.cache import ResponseCache
from composer_pipeline.teachers.config import parse_teachers
from tests.support.provider_emulator import ModelRules, ProviderEmulator

GPT = ModelRules("openai", 128_000, 2.0, 8.0, 0.2)
CLAUDE = ModelRules("anthropic", 200_000, 3.0, 15.0, 0.3, 3.75)
KEY = "sk-ant-emulated-key"
TOOLS = [{"type": "function", "function": {"name": "Read", "parameters": {"type": "object", "properties": {}}}}]
MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "fix the parser " * 40},
]

# usage as each protocol reports it: (openai, anthropic)
CASES = {
    "output_1e12": (
        {"prompt_tokens": 5, "completion_tokens": 10**12, "prompt_tokens_details": {"cached_tokens": 0}},
        {"input_tokens": 5, "output_tokens": 10**12, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
    ),
    "cache_read_1e7": (
        {"prompt_tokens": 10**7 + 5, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 10**7}},
        {"input_tokens": 5, "output_tokens": 3, "cache_read_input_tokens": 10**7},
    ),
    "overflow_2_63": (
        {"prompt_tokens": 2**63, "completion_tokens": 2**63 + 7},
        {"input_tokens": 2**63, "output_tokens": 2**63 + 7, "cache_read_input_tokens": 0},
    ),
    # beyond 64 bits: JSON parsers give a float, which is no token count
    "overflow_2_64": (
        {"prompt_tokens": 5, "completion_tokens": 2**70},
        {"input_tokens": 5, "output_tokens": 2**70},
    ),
    "negative": (
        {"prompt_tokens": -100_000, "completion_tokens": 12},
        {"input_tokens": -100_000, "output_tokens": 12, "cache_read_input_tokens": 100_050},
    ),
}
INVALID = {"overflow_2_64", "negative"}


@pytest.fixture
def emulators():
    """Two providers: the one whose usage is scripted, and an honest one beside it."""
    models = {"gpt": GPT, "claude": CLAUDE}
    bad = ProviderEmulator(models, api_key=KEY).start()
    good = ProviderEmulator(models, api_key=KEY).start()
    yield bad, good
    bad.stop()
    good.stop()


def _teacher(url: str, name: str, api: str, budget: float) -> dict:
    rules = CLAUDE if api == "anthropic" else GPT
    return dict(
        name=name,
        base_url=url,
        model="claude" if api == "anthropic" else "gpt",
        api=api,
        api_key_env="EMU_KEY" if api == "anthropic" else None,
        input_usd_per_mtok=rules.input_usd_per_mtok,
        output_usd_per_mtok=rules.output_usd_per_mtok,
        cached_input_usd_per_mtok=rules.cached_usd_per_mtok,
        budget_usd=budget,
        max_concurrency=2,
        max_tokens=64,
        # anthropic-version 2026-10-21 takes no temperature
        **({"temperature": 0.0} if api == "openai" else {}),
        timeout_s=10.0,
        max_retries=1,
        backoff_s=0.01,
        backoff_max_s=0.02,
    )


def _run(cfg, ledger, cache, run_id):
    reqs = [make_request("s0", "sess", t, MESSAGES, TOOLS, stream_id="sess:0") for t in cfg.teachers]
    keys = {t.name: KEY for t in cfg.teachers}
    return reqs, replay_requests(reqs, cfg, keys, cache=cache, ledger=ledger, run_id=run_id)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_provider_usage_is_settled_within_the_reservation(emulators, ledger_url, tmp_path, api, case):
    bad_emu, good_emu = emulators
    bad_emu.script.append({"usage": CASES[case][api == "anthropic"]})
    # budgets and a ceiling that room one call each: $5 is what an honest answer could never exceed
    cfg = parse_teachers(
        {
            "ceiling_usd": 0.05,
            "teachers": [_teacher(bad_emu.url, "bad", api, 5.0), _teacher(good_emu.url, "honest", api, 5.0)],
        },
        "test",
    )
    led = Ledger(ledger_url)
    reqs, res = _run(cfg, led, ResponseCache(tmp_path / "cache"), "r1")
    rows = {r["teacher"]: r for r in res.table.to_pylist()}
    worst = {r.teacher.name: r.worst_case_usd for r in reqs}
    bad, honest = rows["bad"], rows["honest"]
    # the call is answered and settled, never an internal error, never above its reservation
    assert bad["status"] == "answered", bad["reason"]
    assert 0.0 <= bad["cost_usd"] <= worst["bad"] + 1e-12
    flag = "usage_invalid" if case in INVALID else "usage_over_bound"
    assert flag in bad["reason"]
    # not counts: settled at the worst case (a negative count must not under-record)
    if case in INVALID:
        assert bad["cost_usd"] == pytest.approx(worst["bad"])
        assert bad["prompt_tokens"] is None
    # clamped to what the request could be billed, the claim and its excess in the note
    else:
        assert bad["prompt_tokens"] <= reqs[0].est_prompt_tokens and bad["completion_tokens"] <= 64
        assert "claimed $" in bad["reason"] and "excess $" in bad["reason"]
    assert res.summary["usage_flagged_by_teacher"] == {"bad": 1}
    # the ledger holds exactly that; the honest teacher beside it is untouched and answered
    b = led.balance("bad", 5.0)
    assert b.spent_usd == pytest.approx(bad["cost_usd"]) and b.spent_usd <= worst["bad"] + 1e-12
    assert honest["status"] == "answered" and "usage_" not in (honest["reason"] or "")
    assert led.balance("honest", 5.0).spent_usd == pytest.approx(good_emu.billed_usd(), rel=1e-9)
    notes = [r["note"] or "" for r in ledger_rows(led) if r["teacher"] == "bad"]
    assert any(flag in n for n in notes), notes
    # a re-run serves both answers (from the cache, then from the ledger with a new cache): nothing bought again
    sent = len(bad_emu.requests) + len(good_emu.requests)
    for cache_dir in ("cache", "cache2"):
        _, again = _run(cfg, led, ResponseCache(tmp_path / cache_dir), f"r-{cache_dir}")
        again_rows = again.table.to_pylist()
        assert [r["status"] for r in again_rows] == ["answered", "answered"]
        assert sum(r["paid_usd"] for r in again_rows) == 0.0
    assert len(bad_emu.requests) + len(good_emu.requests) == sent
    assert led.balance("bad", 5.0).spent_usd == pytest.approx(bad["cost_usd"])
