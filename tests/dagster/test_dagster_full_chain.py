"""The whole chain through Dagster: ingest -> cost plan -> replay (real loopback HTTP) -> pairs ->
normalized pairs -> training_set -> trained_policy (Pipes subprocess, tiny model) -> policy_eval."""

import json

import dagster as dg
import pytest
from dagster_sessions import SESSION_ID, write_session, write_teachers_yaml

from assets.definitions import build_defs
from assets.settings import REPO_ROOT, load_settings
from composer_pipeline.store import Store

pytestmark = pytest.mark.slow


def test_full_chain_through_dagster(tmp_path, scripted_server, tiny_model_dir, monkeypatch):
    root = tmp_path / "projects"
    write_session(root, "-home-dev-proj", SESSION_ID, n_steps=4)
    write_session(root, "-home-dev-two", "22222222-0000-0000-0000-000000000002", n_steps=3)
    teachers_yaml = write_teachers_yaml(tmp_path / "teachers.yaml", scripted_server.url)
    for k, v in {
        "COMPOSER_TRACE_ROOT": str(root),
        "COMPOSER_STORE": str(tmp_path / "store"),
        "COMPOSER_TEACHERS_RECIPE": str(teachers_yaml),
        "COMPOSER_TRAIN_MODEL": str(tiny_model_dir),
    }.items():
        monkeypatch.setenv(k, v)
    s = load_settings()
    from dataclasses import replace

    s = replace(
        s,
        ledger_path=str(tmp_path / "ledger.sqlite"),
        cache_dir=str(tmp_path / "cache"),
        checkpoints_dir=str(tmp_path / "ckpt"),
        train=replace(s.train, steps=2),
    )
    assert s.recipe("train") == str(REPO_ROOT / "recipes" / "train.yaml")
    defs = build_defs(s)
    instance = dg.DagsterInstance.ephemeral()
    keys = ["-home-dev-proj__" + SESSION_ID, "-home-dev-two__22222222-0000-0000-0000-000000000002"]
    instance.add_dynamic_partitions("sessions", keys)

    chain = defs.resolve_job_def("session_chain")
    for key in keys:
        res = chain.execute_in_process(partition_key=key, instance=instance)
        assert res.success
        failed = [e.check_name for e in res.get_asset_check_evaluations() if not e.passed]
        assert not failed, failed

    res = defs.resolve_job_def("nightly_training").execute_in_process(instance=instance)
    assert res.success
    store = Store(str(tmp_path / "store"))
    ts = store.read_table("training_set")
    assert (
        ts.num_rows
        == store.read_table("normalized_dpo_pairs").num_rows + store.read_table("agreement_positives").num_rows
    )
    assert ts.num_rows > 0

    meta = {m.asset_key.to_user_string(): m.materialization.metadata for m in res.get_asset_materialization_events()}
    tp = meta["trained_policy"]
    assert sorted(tp["training_partitions"].value) == sorted(set(ts.column("session_key").to_pylist()))
    assert tp["steps"].value == 2
    assert tp["training_set_data_version"].value and tp["training_set_run_id"].value == res.run_id
    assert "data:image/png;base64," in tp["loss_curves"].value
    row = res.output_for_node("trained_policy").to_pylist()[0]
    ckpt = row["local_dir"]
    import os

    assert any(f.endswith(".safetensors") for f in os.listdir(ckpt))
    assert os.path.isfile(os.path.join(ckpt, "tokenizer_config.json")) or os.path.isfile(
        os.path.join(ckpt, "tokenizer.json")
    )
    assert json.loads(row["metrics"])["steps"] == 2
    ev = res.output_for_node("policy_eval")
    assert ev.num_rows >= 1 and set(ev.column("metric").to_pylist()) >= {"reward"}
    checks = {e.check_name: e for e in res.get_asset_check_evaluations()}
    assert "no_regression" in checks
    assert store.read_table("policy_eval").num_rows == ev.num_rows
