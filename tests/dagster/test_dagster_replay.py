"""Replay through Dagster against a real loopback HTTP server: the blocking cost check and the happy path."""

import dagster as dg
import pytest
from dagster_sessions import SESSION_ID, write_teachers_yaml

from assets.ingest import ingest_session_tables, raw_sessions
from assets.pairs import consensus_pairs, normalized_pairs
from assets.replay import cost_plan, cost_plan_within_budget, teacher_replays
from composer_pipeline.store import Store
from resources.ledger import LedgerResource
from resources.recipes import PipelineRecipes
from resources.storage import ParquetIOManager
from resources.teachers import TeachersResource, api_key_envvars

KEY = f"-home-dev-proj__{SESSION_ID}"
CHAIN = [raw_sessions, ingest_session_tables, cost_plan, cost_plan_within_budget, teacher_replays]


def _resources(tmp_path, trace_root, teachers_yaml):
    return {
        "io_manager": ParquetIOManager(root=str(tmp_path / "store")),
        "recipes": PipelineRecipes(trace_root=str(trace_root)),
        "teachers": TeachersResource(recipe=str(teachers_yaml), cache_dir=str(tmp_path / "cache")),
        "ledger": LedgerResource(path=str(tmp_path / "ledger.sqlite")),
    }


def _instance():
    instance = dg.DagsterInstance.ephemeral()
    # a second, never-materialized session: the partitioned cost check must load only KEY's plan
    instance.add_dynamic_partitions("sessions", [KEY, "-home-dev-other__99999999-0000-0000-0000-000000000000"])
    return instance


def test_blocking_cost_check_prevents_any_teacher_request(trace_root, tmp_path, scripted_server):
    teachers_yaml = write_teachers_yaml(tmp_path / "teachers.yaml", scripted_server.url, ceiling_usd=1e-9)
    res = dg.materialize(
        CHAIN,
        partition_key=KEY,
        instance=_instance(),
        resources=_resources(tmp_path, trace_root, teachers_yaml),
        raise_on_error=False,
    )
    assert not res.success
    checks = {e.check_name: e for e in res.get_asset_check_evaluations()}
    assert checks["cost_plan_within_budget"].passed is False
    assert checks["cost_plan_within_budget"].metadata["worst_case_usd"].value > 1e-9
    # it says why in check_plan's own words (plan.reasons), not a second wording of the same decision
    from composer_pipeline.ledger import Ledger
    from composer_pipeline.replay.plan import check_plan
    from composer_pipeline.teachers.config import load_teachers

    plan = check_plan(
        Store(str(tmp_path / "store")).read_table("cost_plan"),
        load_teachers(teachers_yaml),
        Ledger(tmp_path / "ledger.sqlite"),
    )
    assert plan.reasons and any("exceeds ceiling_usd" in r for r in plan.reasons)
    assert checks["cost_plan_within_budget"].description == "; ".join(plan.reasons)
    materialized = {m.asset_key.to_user_string() for m in res.get_asset_materialization_events()}
    assert "cost_plan" in materialized and "teacher_replays" not in materialized
    # not one HTTP request reached the teacher
    assert scripted_server.requests == []


@pytest.mark.slow
def test_replay_and_pairs_chain_over_real_http(trace_root, tmp_path, scripted_server, monkeypatch):
    # a key t0 needs; it may reach the teacher only
    secret = "sk-test-" + "Zq9" * 12
    monkeypatch.setenv("COMPOSER_TEST_TEACHER_KEY", secret)
    teachers_yaml = write_teachers_yaml(
        tmp_path / "teachers.yaml", scripted_server.url, key_env="COMPOSER_TEST_TEACHER_KEY"
    )
    resources = _resources(tmp_path, trace_root, teachers_yaml)
    resources["teachers"] = TeachersResource(
        recipe=str(teachers_yaml), cache_dir=str(tmp_path / "cache"), api_keys=api_key_envvars(str(teachers_yaml))
    )
    # the resource holds the variable's name only
    assert secret not in repr(resources["teachers"])
    instance = _instance()
    res = dg.materialize(
        [*CHAIN, consensus_pairs, normalized_pairs], partition_key=KEY, instance=instance, resources=resources
    )
    assert res.success
    checks = {(e.asset_key.to_user_string(), e.check_name): e for e in res.get_asset_check_evaluations()}
    failed = {k: c.metadata for k, c in checks.items() if not c.passed}
    assert not failed, failed
    # every check of these partitioned assets reports for the session it ran on (the UI's Partition column)
    assert len(checks) == 13 and {c.partition for c in checks.values()} == {KEY}
    store = Store(str(tmp_path / "store"))
    replays = store.read_table("teacher_replays")
    states = store.read_table("trace_states")
    assert replays.num_rows == 3 * states.num_rows
    assert len(scripted_server.requests) == replays.num_rows
    assert set(replays.column("status").to_pylist()) == {"answered"}
    auth = {r.authorization for r in scripted_server.requests}
    assert f"Bearer {secret}" in auth  # t0 got its key over HTTP ...
    logs = instance.get_records_for_run(res.run_id).records
    assert not any(secret in str(rec.event_log_entry) for rec in logs)  # ... and no event/metadata/log has it
    assert not any(secret in str(t.to_pylist()) for t in map(store.read_table, store.table_names()))
    meta = {m.asset_key.to_user_string(): m.materialization.metadata for m in res.get_asset_materialization_events()}
    assert meta["teacher_replays"]["spend_usd"].value > 0
    assert set(meta["teacher_replays"]["spend_usd_by_teacher"].value) == {"t0", "t1", "t2"}
    # show's state view: one table row per teacher
    assert "| t0 |" in meta["teacher_replays"]["example"].value
    # what providers billed (issue #22): the ledger's billed_usage of this run, = spend (the scripted server caches nothing)
    # beside the plan's prediction, in the shape `composer-pipeline replay` prints (predicted_vs_billed)
    billed = meta["teacher_replays"]["predicted_vs_billed"].value
    assert set(billed) == {"t0", "t1", "t2"} and all(b["cached_prompt_tokens"] == 0 for b in billed.values())
    assert sum(b["billed_usd"] for b in billed.values()) == pytest.approx(meta["teacher_replays"]["spend_usd"].value)
    predicted = meta["cost_plan"]["predicted_usd_by_teacher"].value
    assert all(billed[t]["predicted_usd"] == pytest.approx(predicted[t]) for t in billed)
    assert all(b["worst_case_usd"] >= b["billed_usd"] > 0 for b in billed.values())
    assert set(meta["cost_plan"]["predicted_usd_by_teacher"].value) == {"t0", "t1", "t2"}
    # every teacher answers "Read /repo/app.py", the agent did something else -> pairs
    pairs = store.read_table("normalized_dpo_pairs")
    assert store.read_table("dpo_pairs").num_rows >= 1
    assert pairs.num_rows + store.read_table("dropped_pairs").num_rows == store.read_table("dpo_pairs").num_rows
    kinds = meta["dpo_pairs"]["pairs_by_agreement_kind"].value
    assert kinds == {"cross_model": store.read_table("dpo_pairs").num_rows}  # three distinct model names agree
    assert "- **agreement: cross_model**, 3 of 3 models" in meta["dpo_pairs"]["example"].value
    # rendered as on dpo_pairs: with the replays
    norm_example = meta["normalized_dpo_pairs"]["example"].value
    assert "- **agreement: cross_model**" in norm_example and "missing: " not in norm_example
    assert "not replayed yet" not in norm_example and "| t0 |" in norm_example  # every teacher's answer
    assert f"- stream: `{KEY}:main`" in norm_example  # the state's stream, not None
    # ... exactly the view dpo_pairs shows for the same pair (agent line, render options, every answer), bar
    # the table it is listed in
    assert pairs.column("pair_id")[0].as_py() == store.read_table("dpo_pairs").column("pair_id")[0].as_py()
    same_pair = meta["dpo_pairs"]["example"].value.replace(
        "- tables: dpo_pairs (built)", "- tables: normalized_dpo_pairs (kept)"
    )
    assert norm_example == same_pair and "- agent: \n" not in norm_example
    # the pair tables carry the key the UI shows for the session: this run's own partition
    for name in ("dpo_pairs", "normalized_dpo_pairs", "agreement_positives", "dropped_pairs"):
        assert set(store.read_table(name).column("partition_key").to_pylist()) <= {KEY}, name
    assert set(pairs.column("partition_key").to_pylist()) == {KEY}

    # the summary names what it counts: every row went over HTTP once (no cache yet) ...
    s = meta["teacher_replays"]["summary"].value
    n = replays.num_rows
    assert (s["rows"], s["answered"], s["http_requests"], s["from_cache"]) == (n, n, n, 0)
    assert meta["teacher_replays"]["http_requests"].value == n and meta["teacher_replays"]["from_cache"].value == 0
    # the plotted numbers are the summary's own (run_report.replay_summary), not a second count
    top = {k: v.value for k, v in meta["teacher_replays"].items()}
    assert (top["spend_usd"], top["spend_usd_by_teacher"], top["failures_by_reason"]) == (
        s["spend_usd"],
        s["spend_usd_by_teacher"],
        s["failures_by_reason"],
    )
    assert top["fitted_answers"] == s["fitted_answers"] and top["cached_prompt_tokens"] == sum(
        s["cached_prompt_tokens_by_teacher"].values()
    )
    assert s["latency_s_http"]["n"] == n and s["latency_s_cached"] == {"n": 0}
    assert sum(t["http_requests"] for t in s["by_teacher"].values()) == n and set(s["by_teacher"]) == {"t0", "t1", "t2"}
    assert "calls_by_teacher" not in meta["teacher_replays"] and "latency_s" not in meta["teacher_replays"]
    # ... and a re-run answers every row from the cache: no request sent, latencies are the bought ones
    res2 = dg.materialize(
        [*CHAIN], partition_key=KEY, instance=instance, resources=resources, selection=["teacher_replays"]
    )
    assert res2.success and len(scripted_server.requests) == n
    meta2 = {m.asset_key.to_user_string(): m.materialization.metadata for m in res2.get_asset_materialization_events()}
    s2 = meta2["teacher_replays"]["summary"].value
    assert (s2["rows"], s2["answered"], s2["http_requests"], s2["from_cache"]) == (n, n, 0, n)
    assert s2["latency_s_http"] == {"n": 0} and s2["latency_s_cached"]["n"] == n


def test_a_parroting_pair_reaches_dropped_pairs_with_its_reason(trace_root, tmp_path, scripted_server):
    """Teachers that agree on echoing Claude Code's slash-command markup: never a pair, and the row is in
    Dagster's ``dropped_pairs`` with the reason (as the CLI's ``pairs`` writes it), not only a count."""
    scripted_server.default_script = ["answer:<command-name>/init</command-name> Initialized the project notes."]
    teachers_yaml = write_teachers_yaml(tmp_path / "teachers.yaml", scripted_server.url)
    res = dg.materialize(
        [*CHAIN, consensus_pairs, normalized_pairs],
        partition_key=KEY,
        instance=_instance(),
        resources=_resources(tmp_path, trace_root, teachers_yaml),
        raise_on_error=False,
    )
    store = Store(str(tmp_path / "store"))
    dropped = store.read_table("dropped_pairs").to_pylist()
    at_build = [d for d in dropped if d["drop_op"] == "pairs.build"]
    assert at_build and {d["drop_reason"] for d in at_build} == {"chosen_echoes_markup: <command-name>"}
    assert all("<command-name>" in d["chosen_text"] for d in at_build)
    assert store.read_table("normalized_dpo_pairs").num_rows == 0 and store.read_table("dpo_pairs").num_rows == 0
    assert len(at_build) == store.read_table("pairs_dropped_at_build").num_rows
    meta = {m.asset_key.to_user_string(): m.materialization.metadata for m in res.get_asset_materialization_events()}
    assert meta["pairs_dropped_at_build"]["drops_by_reason"].value == {
        "chosen_echoes_markup: <command-name>": len(at_build)
    }
