"""Batch mode (issue 34 item 3): each teacher's outstanding calls go out as provider batches (OpenAI Files +
Batches, Anthropic Message Batches) on the loopback provider emulator (tests/support/batch_api.py), under the
ledger, on both ledgers (SQLite and a real PostgreSQL).

Money: every call reserved at batch prices before its batch is POSTed, settled once from the result file at
the billed usage (× batch_price_factor), expired requests released and resubmitted alone; the ledger's spend
within 1% of what the emulator billed; a run killed or cut off at any point and started again goes on with
its live batches and submits nothing twice."""

from __future__ import annotations

import pytest
from ledger_helpers import ledger_rows

from composer_pipeline.ledger import Ledger
from composer_pipeline.ledger.batches import held_by_batches
from composer_pipeline.replay.batch import replay_batch
from composer_pipeline.replay.requests import make_request
from composer_pipeline.teachers.cache import ResponseCache
from composer_pipeline.teachers.config import parse_teachers
from tests.support.provider_emulator import ModelRules, ProviderEmulator

GPT = ModelRules("openai", 128_000, 2.0, 8.0, 0.2)
CLAUDE = ModelRules("anthropic", 200_000, 3.0, 15.0, 0.3, 3.75)
KEY = "sk-emulated-batch-key"
TOOLS = [{"type": "function", "function": {"name": "Read", "parameters": {"type": "object", "properties": {}}}}]
N_STATES = 5


@pytest.fixture
def emu():
    e = ProviderEmulator({"gpt": GPT, "claude": CLAUDE}, api_key=KEY).start()
    yield e
    e.stop()


def _config(url: str, *, budget: dict[str, float] | None = None, ceiling: float = 5.0):
    def teacher(name: str, api: str) -> dict:
        rules = CLAUDE if api == "anthropic" else GPT
        return dict(
            name=name,
            base_url=url,
            model="claude" if api == "anthropic" else "gpt",
            api=api,
            api_key_env="EMU_KEY",
            input_usd_per_mtok=rules.input_usd_per_mtok,
            output_usd_per_mtok=rules.output_usd_per_mtok,
            cached_input_usd_per_mtok=rules.cached_usd_per_mtok,
            cache_write_usd_per_mtok=rules.cache_write_usd_per_mtok or None,
            budget_usd=(budget or {}).get(name, 5.0),
            max_concurrency=2,
            max_tokens=64,
            timeout_s=1.0,
        )

    return parse_teachers(
        {
            "ceiling_usd": ceiling,
            "mode": "batch",
            "poll_batches_s": 0.01,
            "teachers": [teacher("oa", "openai"), teacher("an", "anthropic")],
        },
        "test",
    )


def _requests(cfg):
    out = []
    for i in range(N_STATES):
        msgs = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": f"task {i}: fix the parser " * 20},
        ]
        out += [make_request(f"s{i}", "sess", t, msgs, TOOLS, stream_id=f"sess:{i}") for t in cfg.teachers]
    return out


def _run(cfg, reqs, led, cache, run_id="r1", wait=False):
    keys = {t.name: KEY for t in cfg.teachers}
    return replay_batch(reqs, cfg, keys, cache=cache, ledger=led, run_id=run_id, wait=wait, sleep=lambda s: None)


def _spent(led, cfg) -> float:
    return sum(led.balance(t.name, t.budget_usd).spent_usd for t in cfg.teachers)


def _assert_all_answered_at_batch_rate(emu, led, cfg, res):
    rows = res.table.to_pylist()
    assert [r["status"] for r in rows] == ["answered"] * len(rows), [r["reason"] for r in rows]
    assert len(emu.billed) == len(rows) and all(b.batch for b in emu.billed)  # each request billed once, batched
    assert _spent(led, cfg) == pytest.approx(emu.billed_usd(), rel=0.01)
    billed = ledger_rows(led, "billed_usage")
    assert sorted(b["call_id"] for b in billed) == sorted(r["call_id"] for r in rows)  # each settled once
    assert not any(r["state"] == "batched" for r in ledger_rows(led))  # nothing still held


def test_submit_then_collect_with_no_wait(emu, ledger_url, tmp_path):
    cfg = _config(emu.url)
    reqs = _requests(cfg)
    led, cache = Ledger(ledger_url), ResponseCache(tmp_path / "cache")
    first = _run(cfg, reqs, led, cache)
    rows = first.table.to_pylist()
    assert all(r["reason"].startswith("batch_pending") for r in rows)
    assert first.summary["batch"]["batches_submitted"] == 2 and first.summary["batch"]["calls_pending"] == 10
    assert [b.api for b in emu.batches.created()] == ["openai", "anthropic"]  # one batch per teacher
    assert {len(b.lines) for b in emu.batches.created()} == {N_STATES}
    assert {c for b in emu.batches.created() for c, _ in b.lines} == {r.call_id for r in reqs}  # custom_id = call id
    # the worst case at batch prices is held, and shown as held by batches
    worst = {t.name: sum(r.worst_case_usd for r in reqs if r.teacher.name == t.name) * 0.5 for t in cfg.teachers}
    for t in cfg.teachers:
        held, n_batches, n_calls = held_by_batches(led, t.name)
        assert held == pytest.approx(worst[t.name], rel=1e-9) and (n_batches, n_calls) == (1, N_STATES)
        assert led.balance(t.name, t.budget_usd).reserved_usd == pytest.approx(worst[t.name], rel=1e-9)
    # still in progress: nothing submitted twice
    again = _run(cfg, reqs, led, cache, run_id="r2")
    assert again.summary["batch"]["batches_submitted"] == 0 and len(emu.batches.created()) == 2
    assert emu.billed == []
    emu.batches.end = True
    done = _run(cfg, reqs, led, cache, run_id="r3")
    assert done.summary["batch"]["batches_collected"] == 2 and len(emu.batches.created()) == 2
    _assert_all_answered_at_batch_rate(emu, led, cfg, done)
    from composer_pipeline.ledger.billing import usage_by_run

    # the collecting run's summary reports what it settled
    by_run = usage_by_run(led, "r3")
    assert sum(v["billed_usd"] for v in by_run.values()) == pytest.approx(emu.billed_usd(), rel=0.01)
    # half of what the same tokens cost in sync mode (the emulator prices the same usage at full rate)
    full = sum(b.usd for b in emu.billed) / 0.5
    assert _spent(led, cfg) == pytest.approx(full * 0.5, rel=0.01)
    # a re-run (even with a new cache) serves everything: nothing sent, nothing paid
    before = len(emu.batches.created())
    for cache_dir in ("cache", "cache2"):
        served = _run(cfg, reqs, led, ResponseCache(tmp_path / cache_dir), run_id=f"r-{cache_dir}")
        assert sum(r["paid_usd"] for r in served.table.to_pylist()) == 0.0
        assert {r["status"] for r in served.table.to_pylist()} == {"answered"}
    assert len(emu.batches.created()) == before and len(emu.billed) == 2 * N_STATES


def test_lost_answer_to_the_batch_post_is_found_again_not_resubmitted(emu, ledger_url, tmp_path):
    """Killed (here: cut off) between the ledger record and the provider's answer: the provider has the batch;
    the next run finds it (OpenAI by metadata, Anthropic by an unknown batch of as many requests since the
    record) and submits nothing again."""
    cfg = _config(emu.url)
    reqs = _requests(cfg)
    led, cache = Ledger(ledger_url), ResponseCache(tmp_path / "cache")
    # both creations made, neither answered (the client times out after 1 s)
    emu.batches.hang_creates = 2
    first = _run(cfg, reqs, led, cache)
    emu.batches.release.set()
    # no answer to either POST: both looked for in the same pass (its collect step), found, their ids recorded
    assert first.summary["batch"]["batches_submitted"] == 0 and first.summary["batch"]["batches_recovered"] == 2
    assert len(emu.batches.created()) == 2  # the provider has both
    emu.batches.end = True
    done = _run(cfg, reqs, led, cache, run_id="r2")
    assert done.summary["batch"]["batches_submitted"] == 0 and done.summary["batch"]["batches_collected"] == 2
    assert len(emu.batches.created()) == 2  # nothing submitted twice
    assert sorted(b["provider_id"] for b in ledger_rows(led, "batches")) == sorted(b.id for b in emu.batches.created())
    _assert_all_answered_at_batch_rate(emu, led, cfg, done)


def test_a_post_that_never_reached_the_provider_is_resubmitted_once(emu, ledger_url, tmp_path):
    cfg = _config(emu.url)
    reqs = _requests(cfg)
    led, cache = Ledger(ledger_url), ResponseCache(tmp_path / "cache")
    # 503: the outcome is unknown to the client, the provider has nothing
    emu.batches.fail_creates = 2
    first = _run(cfg, reqs, led, cache)
    # looked for in the same pass: the provider's list provably holds none, so each goes out again, once
    assert first.summary["batch"]["batches_submitted"] == 2 and first.summary["batch"]["batches_recovered"] == 0
    assert len(emu.batches.created()) == 2
    # the same records, the same reservations
    assert len(ledger_rows(led, "batches")) == 2
    assert len([r for r in ledger_rows(led) if r["state"] == "batched"]) == 2 * N_STATES
    emu.batches.end = True
    done = _run(cfg, reqs, led, cache, run_id="r2")
    assert done.summary["batch"]["batches_submitted"] == 0 and len(emu.batches.created()) == 2
    _assert_all_answered_at_batch_rate(emu, led, cfg, done)


def test_expired_requests_alone_are_resubmitted(emu, ledger_url, tmp_path):
    cfg = _config(emu.url)
    reqs = _requests(cfg)
    led, cache = Ledger(ledger_url), ResponseCache(tmp_path / "cache")
    by_teacher = {t.name: [r.call_id for r in reqs if r.teacher.name == t.name] for t in cfg.teachers}
    expired = {by_teacher["oa"][1], by_teacher["an"][3]}
    emu.batches.expire |= expired
    emu.batches.error.add(by_teacher["an"][0])
    emu.batches.end = True
    res = _run(cfg, reqs, led, cache, wait=True)
    created = emu.batches.created()
    # one per teacher, then one per teacher with only its released calls
    assert len(created) == 4
    assert [sorted(c for c, _ in b.lines) for b in created[2:]] == [
        [by_teacher["oa"][1]],
        sorted([by_teacher["an"][0], by_teacher["an"][3]]),
    ]
    assert res.summary["batch"]["calls_resubmitted"] == 3
    _assert_all_answered_at_batch_rate(emu, led, cfg, res)
    released = [r for r in ledger_rows(led) if r["state"] == "released"]
    assert sorted(r["call_id"] for r in released) == sorted(expired | {by_teacher["an"][0]})


def test_batch_budget_refuses_what_does_not_fit_and_the_plan_counts_held_money(emu, ledger_url, tmp_path):
    from composer_pipeline.replay.batch import priced_for_batch
    from composer_pipeline.replay.plan import plan_requests

    reqs0 = _requests(_config(emu.url))
    one = {n: max(r.worst_case_usd for r in reqs0 if r.teacher.name == n) * 0.5 for n in ("oa", "an")}
    cfg = _config(emu.url, budget={n: v * 3.5 for n, v in one.items()})  # room for 3 of 5 calls per teacher
    reqs = _requests(cfg)
    led, cache = Ledger(ledger_url), ResponseCache(tmp_path / "cache")
    res = _run(cfg, reqs, led, cache)
    statuses = [r["status"] for r in res.table.to_pylist()]
    assert statuses.count("budget_exhausted") == 4 and len(emu.batches.created()) == 2
    for t in cfg.teachers:
        assert led.balance(t.name, t.budget_usd).spent_usd <= t.budget_usd + 1e-12
    # the plan of the same run: the held calls need nothing new; the others do not fit the budget left
    plan = plan_requests(priced_for_batch(reqs), cfg, cache, led)
    assert not plan.fits and set(plan.over_budget) == {"oa", "an"}
    for t in cfg.teachers:
        assert plan.remaining_budget_by_teacher[t.name] < one[t.name]
        assert plan.worst_case_by_teacher[t.name] == pytest.approx(2 * one[t.name], rel=0.2)


@pytest.mark.slow
def test_cli_batch_replay_killed_mid_post_then_rerun_finishes_once(emu, ledger_url, tmp_path, samples_dir):
    """The issue's case, through the CLI: ``replay --mode batch`` killed (SIGKILL) while its first batch POST
    waits for the provider's answer (the provider made the batch; the ledger has it recorded, no provider id).
    Run again with the same arguments: the batch is found, the other teacher's goes out, nothing twice; once
    they end, a last run collects: every state answered, one batch per teacher, each request billed once at
    the batch rate, the ledger's spend within 1% of what the emulator billed."""
    import os
    import signal
    import subprocess
    import sys

    import orjson
    import pyarrow.parquet as pq
    import yaml

    cfg_file = tmp_path / "teachers.yaml"
    teachers = []
    for t in _config(emu.url).teachers:
        teachers.append(
            {
                k: getattr(t, k)
                for k in (
                    "name",
                    "base_url",
                    "model",
                    "api",
                    "api_key_env",
                    "input_usd_per_mtok",
                    "output_usd_per_mtok",
                    "cached_input_usd_per_mtok",
                    "cache_write_usd_per_mtok",
                    "budget_usd",
                    "max_concurrency",
                    "max_tokens",
                )
            }
            | {"timeout_s": 30.0}
        )
    cfg_file.write_text(yaml.safe_dump({"ceiling_usd": 5.0, "poll_batches_s": 0.05, "teachers": teachers}))
    args = [
        sys.executable,
        "-m",
        "composer_pipeline",
        "replay",
        "--states",
        samples_dir,
        "--teachers",
        cfg_file,
        "--out",
        tmp_path / "out",
        "--ledger",
        ledger_url,
        "--cache",
        tmp_path / "cache",
        "--mode",
        "batch",
    ]
    env = {**os.environ, "EMU_KEY": KEY}
    emu.batches.hang_creates = 1
    proc = subprocess.Popen([*map(str, args), "--no-wait"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert emu.batches.hung.wait(60), "the first batch POST never arrived"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        emu.batches.release.set()
    led = Ledger(ledger_url)
    assert [(b["state"], b["provider_id"]) for b in ledger_rows(led, "batches")] == [("recorded", None)]
    # the provider has it; the ledger does not know its id
    assert len(emu.batches.created()) == 1

    again = subprocess.run([*map(str, args), "--no-wait"], env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    summary = orjson.loads(again.stdout.strip().splitlines()[-1])
    assert summary["batch"]["batches_recovered"] == 1 and summary["batch"]["batches_submitted"] == 1
    assert [b.api for b in emu.batches.created()] == ["openai", "anthropic"]  # one per teacher, nothing twice
    budget = [sys.executable, "-m", "composer_pipeline", "teachers", "budget", "--teachers", str(cfg_file)]
    budget += ["--ledger", ledger_url, "--json"]

    def budgets() -> dict[str, dict]:
        out = subprocess.run(budget, capture_output=True, text=True, timeout=60, check=True).stdout
        return {b["teacher"]: b for b in map(orjson.loads, out.splitlines())}

    held = {b.api: len(b.lines) for b in emu.batches.created()}
    for name, api in (("oa", "openai"), ("an", "anthropic")):  # the money live batches hold, shown
        b = budgets()[name]
        assert (b["live_batches"], b["batch_pending_calls"]) == (1, held[api])
        assert b["batch_held_usd"] == pytest.approx(b["reserved_usd"], rel=1e-6) and b["batch_held_usd"] > 0

    emu.batches.end = True
    last = subprocess.run(list(map(str, args)), env=env, capture_output=True, text=True, timeout=120)
    assert last.returncode == 0, last.stderr[-2000:]
    rows = pq.read_table(tmp_path / "out" / "replays.parquet").to_pylist()
    assert rows and {r["status"] for r in rows} == {"answered"}, {r["reason"] for r in rows}
    assert len(emu.batches.created()) == 2
    cfg = _config(emu.url)
    assert len(emu.billed) == len({r["call_id"] for r in rows}) and all(b.batch for b in emu.billed)
    assert _spent(led, cfg) == pytest.approx(emu.billed_usd(), rel=0.01)
    assert len(ledger_rows(led, "billed_usage")) == len(emu.billed)
    assert all(b["batch_held_usd"] == 0 and b["live_batches"] == 0 for b in budgets().values())


def test_a_sync_run_never_buys_a_call_a_live_batch_holds(emu, ledger_url, tmp_path):
    import dataclasses

    from composer_pipeline.replay.run import replay_requests

    cfg = _config(emu.url)
    reqs = _requests(cfg)
    led = Ledger(ledger_url)
    _run(cfg, reqs, led, ResponseCache(tmp_path / "cache"))  # submitted, in progress
    held = sum(led.balance(t.name, t.budget_usd).spent_usd for t in cfg.teachers)
    sync = dataclasses.replace(cfg, mode="sync")
    keys = {t.name: KEY for t in cfg.teachers}
    res = replay_requests(reqs, sync, keys, cache=ResponseCache(tmp_path / "c2"), ledger=led, run_id="sync")
    assert [r for r in emu.requests if r.path in ("/v1/chat/completions", "/v1/messages")] == []
    assert all(r["reason"].startswith("batch_pending") for r in res.table.to_pylist())
    assert sum(led.balance(t.name, t.budget_usd).spent_usd for t in cfg.teachers) == pytest.approx(held)
    emu.batches.end = True
    done = _run(cfg, reqs, led, ResponseCache(tmp_path / "cache"), run_id="collect")
    _assert_all_answered_at_batch_rate(emu, led, cfg, done)


def test_a_batch_another_live_run_is_posting_is_left_to_it(emu, ledger_url, tmp_path):
    """A batch recorded by a run that is still live (its POST may be on the wire) is neither looked for nor
    resubmitted by another process; once that run is gone, the next run looks for it (here: absent) and
    sends it, once."""
    from composer_pipeline.ledger.batches import BatchCall, record_batch
    from composer_pipeline.replay.batch import batch_priced
    from composer_pipeline.teachers.pricing import max_completion_tokens, worst_case_usd

    cfg = _config(emu.url)
    reqs = _requests(cfg)
    other = Ledger(ledger_url)  # another process: its own owner token
    other.start_run("other", 30.0)
    oa = cfg.teacher("oa")
    calls = []
    for r in reqs:
        if r.teacher.name == "oa":
            est, worst = worst_case_usd(r.body, batch_priced(oa))
            calls.append(BatchCall(r.call_id, worst, est, max_completion_tokens(r.body, oa)))
    rec = record_batch(other, "oa", "openai", "other", calls, budget_usd=5.0, ceiling_usd=5.0)
    assert len(rec.granted) == N_STATES
    led = Ledger(ledger_url)
    first = _run(cfg, reqs, led, ResponseCache(tmp_path / "cache"))
    assert [b.api for b in emu.batches.created()] == ["anthropic"]  # oa's calls are left to the live run
    assert first.summary["batch"]["batches_recovered"] == 0
    # that process is gone without ever hearing from the provider
    other.close_run("other")
    emu.batches.end = True
    done = _run(cfg, reqs, led, ResponseCache(tmp_path / "cache"), run_id="r2", wait=True)
    assert [b.api for b in emu.batches.created()] == ["anthropic", "openai"]
    _assert_all_answered_at_batch_rate(emu, led, cfg, done)


def test_batches_respect_the_provider_limits_and_a_refused_batch_releases_its_calls(
    emu, ledger_url, tmp_path, monkeypatch
):
    from composer_pipeline.replay import batch

    cfg = _config(emu.url)
    reqs = _requests(cfg)
    client = batch.BatchClient(cfg.teacher("an"), KEY)
    sizes = [len(client.line(r.call_id, batch.wire_body(r.teacher, r.body))) for r in reqs if r.teacher.name == "an"]
    client.close()
    # more than one request line, less than two
    line = int(max(sizes) * 1.5)
    monkeypatch.setitem(batch.LIMITS, "openai", (2, 10**9))  # by count: 2 + 2 + 1
    monkeypatch.setitem(batch.LIMITS, "anthropic", (100, line))  # by bytes: one request per batch
    # the provider refuses the OpenAI batches of 2 (400: certainly not created)
    emu.batches.max_requests = 1
    led = Ledger(ledger_url)
    res = _run(cfg, reqs, led, ResponseCache(tmp_path / "cache"))
    created = emu.batches.created()
    assert [len(b.lines) for b in created if b.api == "openai"] == [1]
    assert [len(b.lines) for b in created if b.api == "anthropic"] == [1] * N_STATES
    rows = [r for r in res.table.to_pylist() if r["teacher"] == "oa"]
    refused = [r for r in rows if (r["reason"] or "").startswith("batch_refused")]
    assert len(refused) == 4 and "at most 1 requests per batch" in refused[0]["reason"]
    assert led.balance("oa", 5.0).reserved_usd == pytest.approx(
        sum(r.worst_case_usd for r in reqs if r.teacher.name == "oa" and r.call_id in {c for c, _ in created[0].lines})
        * 0.5,
        rel=1e-9,
        # the refused calls' money is released; only the accepted batch holds
    )


@pytest.mark.slow
def test_two_lost_anthropic_batches_of_one_size_are_told_apart_by_their_results(emu, ledger_url, tmp_path):
    """Message Batches carry no metadata: two unanswered POSTs of as many requests each are matched only once
    the provider's batches end, by the custom ids in their results; nothing is resubmitted."""
    import dataclasses

    base = _config(emu.url)
    an = base.teacher("an")
    cfg = dataclasses.replace(base, teachers=[an, dataclasses.replace(an, name="an2", seed=7)])
    reqs = _requests(cfg)
    led = Ledger(ledger_url)
    emu.batches.hang_creates = 2
    first = _run(cfg, reqs, led, ResponseCache(tmp_path / "cache"))
    emu.batches.release.set()
    # two alike, in progress: not told apart yet
    assert first.summary["batch"]["batches_recovered"] == 0
    assert [b["state"] for b in ledger_rows(led, "batches")] == ["recorded", "recorded"]
    emu.batches.end = True
    done = _run(cfg, reqs, led, ResponseCache(tmp_path / "cache"), run_id="r2")
    assert done.summary["batch"]["batches_recovered"] == 2 and len(emu.batches.created()) == 2
    _assert_all_answered_at_batch_rate(emu, led, cfg, done)
