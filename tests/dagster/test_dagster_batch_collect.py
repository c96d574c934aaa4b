"""Batch mode in Dagster (issue 34 §3, "Collecting"): ``teacher_replays`` submits provider batches and returns
(no table, an observation of what went out and what is held); ``batch_collect_sensor`` asks the provider
whether they ended and requests one run per partition whose batches ended, which collects every answer at
the batch rate. A real Dagster instance, the loopback provider emulator's batch APIs (tests/support/batch_api.py),
both ledgers (SQLite and a real PostgreSQL)."""

import time
import uuid

import dagster as dg
import pytest
import yaml
from dagster_sessions import SESSION_ID
from ledger_helpers import ledger_rows

from assets.definitions import batch_collect_job
from assets.ingest import ingest_session_tables, raw_sessions
from assets.pairs import consensus_pairs, normalized_pairs
from assets.replay import cost_plan, cost_plan_within_budget, teacher_replays
from assets.sensors import build_batch_collect_sensor
from composer_pipeline.ledger import Ledger
from composer_pipeline.ledger.batches import held_by_batches
from composer_pipeline.store import Store
from resources.ledger import LedgerResource
from resources.recipes import PipelineRecipes
from resources.storage import ParquetIOManager
from resources.teachers import TeachersResource, api_key_envvars
from tests.support.provider_emulator import ModelRules, ProviderEmulator

KEY = f"-home-dev-proj__{SESSION_ID}"
SID2 = "99999999-2222-3333-4444-555555555555"
KEY2 = f"-home-dev-other__{SID2}"
API_KEY = "sk-emulated-dagster-batch-key"
GPT = ModelRules("openai", 128_000, 2.0, 8.0, 0.2)
CLAUDE = ModelRules("anthropic", 200_000, 3.0, 15.0, 0.3, 3.75)
ASSETS = [raw_sessions, ingest_session_tables, cost_plan, teacher_replays, consensus_pairs, normalized_pairs]


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "ledger.sqlite")
    return request.getfixturevalue("postgres_server").create_database(f"ledger_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def emu():
    e = ProviderEmulator({"gpt": GPT, "claude": CLAUDE}, api_key=API_KEY).start()
    yield e
    e.stop()


def _teachers_yaml(path, url: str):
    def teacher(name: str, api: str, rules: ModelRules) -> dict:
        return {
            "name": name,
            "base_url": url,
            "model": "claude" if api == "anthropic" else "gpt",
            "api": api,
            "api_key_env": "EMU_BATCH_KEY",
            "input_usd_per_mtok": rules.input_usd_per_mtok,
            "output_usd_per_mtok": rules.output_usd_per_mtok,
            "cached_input_usd_per_mtok": rules.cached_usd_per_mtok,
            "cache_write_usd_per_mtok": rules.cache_write_usd_per_mtok or None,
            "budget_usd": 5.0,
            "max_concurrency": 2,
            "max_tokens": 64,
            "timeout_s": 5.0,
        }

    cfg = {
        "ceiling_usd": 5.0,
        "mode": "batch",
        "teachers": [teacher("oa", "openai", GPT), teacher("an", "anthropic", CLAUDE)],
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def _tick(sensor, instance, resources):
    ctx = dg.build_sensor_context(
        instance=instance, resources={"teachers": resources["teachers"], "ledger": resources["ledger"]}
    )
    return sensor(ctx)


def _setup(trace_root, tmp_path, emu, ledger_url, monkeypatch):
    monkeypatch.setenv("EMU_BATCH_KEY", API_KEY)
    teachers_yaml = _teachers_yaml(tmp_path / "teachers.yaml", emu.url)
    resources = {
        "io_manager": ParquetIOManager(root=str(tmp_path / "store")),
        "recipes": PipelineRecipes(trace_root=str(trace_root)),
        "teachers": TeachersResource(
            recipe=str(teachers_yaml), cache_dir=str(tmp_path / "cache"), api_keys=api_key_envvars(str(teachers_yaml))
        ),
        "ledger": LedgerResource(path=ledger_url),
    }
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("sessions", [KEY])
    return resources, instance


def _collect(resources, instance, req):
    """The run the sensor requested, as the daemon would launch it: the batch_collect job, its partition and key."""
    defs = dg.Definitions(
        assets=ASSETS, asset_checks=[cost_plan_within_budget], jobs=[batch_collect_job], resources=resources
    )
    return defs.resolve_job_def("batch_collect").execute_in_process(
        instance=instance, partition_key=req.partition_key, tags={"dagster/run_key": req.run_key}
    )


def _observations(result) -> list[dict]:
    return [
        {k: v.value for k, v in e.event_specific_data.asset_observation.metadata.items()}
        for e in result.all_events
        if e.event_type_value == "ASSET_OBSERVATION" and e.asset_key == dg.AssetKey("teacher_replays")
    ]


@pytest.mark.slow
def test_backfill_submits_and_the_sensor_collects_once(trace_root, tmp_path, emu, ledger_url, monkeypatch):
    resources, instance = _setup(trace_root, tmp_path, emu, ledger_url, monkeypatch)

    # 1. the backfill's run submits and returns: no table, nothing downstream, an observation of what went out
    t0 = time.monotonic()
    sub = dg.materialize([*ASSETS, cost_plan_within_budget], partition_key=KEY, instance=instance, resources=resources)
    assert sub.success and time.monotonic() - t0 < 30
    materialized = {m.asset_key.to_user_string() for m in sub.get_asset_materialization_events()}
    assert "teacher_replays" not in materialized and "dpo_pairs" not in materialized
    assert "teacher_replays" not in Store(str(tmp_path / "store")).table_names()
    (obs,) = [
        e.event_specific_data.asset_observation
        for e in sub.all_events
        if e.event_type_value == "ASSET_OBSERVATION" and e.asset_key == dg.AssetKey("teacher_replays")
    ]
    assert obs.partition == KEY
    meta = {k: v.value for k, v in obs.metadata.items()}
    created = emu.batches.created()
    assert [b.api for b in created] == ["openai", "anthropic"]  # one batch per teacher
    n_calls = sum(len(b.lines) for b in created)
    assert n_calls > 0 and meta["batch_pending_calls"] == n_calls and meta["batches_submitted"] == 2
    led = Ledger(ledger_url)
    held = sum(held_by_batches(led, t)[0] for t in ("oa", "an"))
    assert held > 0 and meta["batch_held_usd"] == pytest.approx(held, rel=1e-9)
    assert sorted(meta["live_batch_ids"]) == sorted(b["id"] for b in ledger_rows(led, "batches"))
    assert emu.billed == []  # nothing bought yet
    checks = {e.check_name: e for e in sub.get_asset_check_evaluations()}
    assert checks["error_rate"].passed and checks["error_rate"].metadata["batch_pending"].value == n_calls

    # 2. batches still running: the sensor skips and says what is pending
    sensor = build_batch_collect_sensor(batch_collect_job, 60)
    skip = _tick(sensor, instance, resources)
    assert isinstance(skip, dg.SkipReason)
    assert skip.skip_message.startswith("still pending") and KEY in skip.skip_message
    assert skip.skip_message.count(": running") == 2

    # 3. they end: exactly one run for the partition, keyed by its batch ids
    emu.batches.end = True
    result = _tick(sensor, instance, resources)
    (req,) = result.run_requests
    ids = sorted(b["id"] for b in ledger_rows(led, "batches"))
    assert req.partition_key == KEY and req.run_key == "batch-collect:" + ",".join(ids)

    # 4. that run collects every answer at the batch rate, nothing bought twice, and builds the pairs
    run = _collect(resources, instance, req)
    assert run.success and _observations(run) == []
    done = {m.asset_key.to_user_string() for m in run.get_asset_materialization_events()}
    assert {"teacher_replays", "dpo_pairs", "normalized_dpo_pairs"} <= done
    rows = Store(str(tmp_path / "store")).read_table("teacher_replays").to_pylist()
    sent = [r for r in rows if r["call_id"] in {c for b in created for c, _ in b.lines}]
    assert len(sent) == n_calls and {r["status"] for r in sent} == {"answered"}, {r["reason"] for r in sent}
    assert len(emu.batches.created()) == 2  # nothing submitted again
    assert len(emu.billed) == n_calls and all(b.batch for b in emu.billed)  # each request billed once, batched
    spent = sum(led.balance(t, 5.0).spent_usd for t in ("oa", "an"))
    assert spent == pytest.approx(emu.billed_usd(), rel=0.01)
    assert sorted(b["call_id"] for b in ledger_rows(led, "billed_usage")) == sorted(r["call_id"] for r in sent)
    assert all(held_by_batches(led, t)[0] == 0 for t in ("oa", "an"))

    # 5. collected: the next tick requests nothing
    again = _tick(sensor, instance, resources)
    assert isinstance(again, dg.SkipReason) and "no provider batch" in again.skip_message


@pytest.mark.slow
def test_a_collecting_run_the_provider_did_not_answer_is_requested_again(
    trace_root, tmp_path, emu, ledger_url, monkeypatch
):
    """The provider said the batches ended, then failed the collecting run's reads (503): that run writes no
    table and settles nothing; the next tick requests the collection again under a new key, which collects."""
    resources, instance = _setup(trace_root, tmp_path, emu, ledger_url, monkeypatch)
    assert dg.materialize(ASSETS, partition_key=KEY, instance=instance, resources=resources).success
    n_calls = sum(len(b.lines) for b in emu.batches.created())
    sensor = build_batch_collect_sensor(batch_collect_job, 60)
    emu.batches.end = True
    (first,) = _tick(sensor, instance, resources).run_requests
    # both teachers' batch reads in the collecting run
    emu.batches.fail_reads = 2
    led = Ledger(ledger_url)
    failed = _collect(resources, instance, first)
    assert failed.success and "teacher_replays" not in {
        m.asset_key.to_user_string() for m in failed.get_asset_materialization_events()
    }
    (obs,) = _observations(failed)
    assert obs["batch_pending_calls"] == n_calls and ledger_rows(led, "billed_usage") == []
    (again,) = _tick(sensor, instance, resources).run_requests
    assert again.partition_key == KEY and again.run_key == first.run_key + "#1"
    done = _collect(resources, instance, again)
    assert done.success and "teacher_replays" in {
        m.asset_key.to_user_string() for m in done.get_asset_materialization_events()
    }
    assert len(ledger_rows(led, "billed_usage")) == n_calls == len(emu.billed) and len(emu.batches.created()) == 2
    assert isinstance(_tick(sensor, instance, resources), dg.SkipReason)


@pytest.mark.slow
def test_a_collecting_run_that_also_settles_another_sessions_batches_leaves_that_session_its_run(
    trace_root, tmp_path, emu, ledger_url, monkeypatch
):
    """Two sessions, each with its own batches. A collecting pass reads every live batch of its teachers, so the
    first session's run settles the second's too; the sensor still requests the second session's run (its
    table was not written since), which serves its answers from the ledger: each call bought once."""
    from dagster_sessions import write_session

    write_session(trace_root, "-home-dev-other", SID2)
    resources, instance = _setup(trace_root, tmp_path, emu, ledger_url, monkeypatch)
    instance.add_dynamic_partitions("sessions", [KEY2])
    for pk in (KEY, KEY2):
        assert dg.materialize(ASSETS, partition_key=pk, instance=instance, resources=resources).success
    created = emu.batches.created()
    assert [b.api for b in created] == ["openai", "anthropic"] * 2  # one batch per teacher per session
    n_calls = sum(len(b.lines) for b in created)
    sensor = build_batch_collect_sensor(batch_collect_job, 60)
    skip = _tick(sensor, instance, resources)
    assert isinstance(skip, dg.SkipReason) and KEY in skip.skip_message and KEY2 in skip.skip_message
    emu.batches.end = True
    first = {r.partition_key: r for r in _tick(sensor, instance, resources).run_requests}
    assert sorted(first) == sorted([KEY, KEY2])
    assert _collect(resources, instance, first[KEY]).success
    led = Ledger(ledger_url)
    assert {b["state"] for b in ledger_rows(led, "batches")} == {"collected"}  # all four, by the first run
    # the other session is still to be written
    (second,) = _tick(sensor, instance, resources).run_requests
    assert second.partition_key == KEY2 and second.run_key == first[KEY2].run_key
    assert _collect(resources, instance, second).success
    assert len(emu.billed) == n_calls and len(emu.batches.created()) == 4  # nothing bought twice
    assert len(ledger_rows(led, "billed_usage")) == n_calls
    # every call of each session answered in its own table
    for pk in (KEY, KEY2):
        s = _replays_summary(instance, pk)
        assert s["failed"] == 0 and s["answered"] == s["rows"] > 0, pk
    assert isinstance(_tick(sensor, instance, resources), dg.SkipReason)


def _replays_summary(instance, pk: str) -> dict:
    (rec,) = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("teacher_replays"), asset_partitions=[pk]), limit=1
    ).records
    return rec.asset_materialization.metadata["summary"].value


@pytest.mark.slow
def test_a_session_whose_calls_another_sessions_batches_hold_is_collected_too(
    trace_root, tmp_path, emu, ledger_url, monkeypatch
):
    """The same session under a second project: every call is already held by the first session's batches, so
    its run records no batch; its observation names the batches it waits on, and the sensor requests its
    collecting run too. Nothing is bought twice."""
    import shutil

    (trace_root / "-home-dev-copy").mkdir()
    shutil.copy(trace_root / "-home-dev-proj" / f"{SESSION_ID}.jsonl", trace_root / "-home-dev-copy")
    copy = f"-home-dev-copy__{SESSION_ID}"
    resources, instance = _setup(trace_root, tmp_path, emu, ledger_url, monkeypatch)
    instance.add_dynamic_partitions("sessions", [copy])
    runs = [dg.materialize(ASSETS, partition_key=pk, instance=instance, resources=resources) for pk in (KEY, copy)]
    assert all(r.success for r in runs)
    created = emu.batches.created()
    # the copy's calls went out once, with the first
    assert [b.api for b in created] == ["openai", "anthropic"]
    led = Ledger(ledger_url)
    assert {b["run_id"] for b in ledger_rows(led, "batches")} == {runs[0].run_id}
    (obs,) = _observations(runs[1])
    assert sorted(obs["live_batch_ids"]) == sorted(b["id"] for b in ledger_rows(led, "batches"))
    sensor = build_batch_collect_sensor(batch_collect_job, 60)
    emu.batches.end = True
    reqs = _tick(sensor, instance, resources).run_requests
    assert sorted(r.partition_key for r in reqs) == sorted([KEY, copy])
    for req in reqs:
        assert _collect(resources, instance, req).success
    n_calls = sum(len(b.lines) for b in created)
    assert len(emu.billed) == n_calls == len(ledger_rows(led, "billed_usage"))  # nothing bought twice
    for pk in (KEY, copy):
        s = _replays_summary(instance, pk)
        assert s["answered"] == s["rows"] == n_calls, pk
    assert isinstance(_tick(sensor, instance, resources), dg.SkipReason)
