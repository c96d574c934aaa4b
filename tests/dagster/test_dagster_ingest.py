"""The ingest chain materialized through Dagster for one session partition (ephemeral instance)."""

import dagster as dg
from dagster_sessions import FAKE_GITHUB_TOKEN, SESSION_ID, session_lines

from assets.ingest import ingest_session_tables, raw_sessions
from composer_pipeline.ingest import native
from composer_pipeline.store import Store
from resources.recipes import PipelineRecipes
from resources.storage import ParquetIOManager


def test_ingest_chain_materializes_partition(trace_root, tmp_path):
    """A short partition key (project/id) names the session; the tables keep the full session key."""
    key = "proj/11111111"
    session_key = f"-home-dev-proj__{SESSION_ID}"
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("sessions", [key])
    store_root = tmp_path / "store"
    res = dg.materialize(
        [raw_sessions, ingest_session_tables],
        partition_key=key,
        instance=instance,
        resources={
            "io_manager": ParquetIOManager(root=str(store_root)),
            "recipes": PipelineRecipes(trace_root=str(trace_root)),
        },
    )
    assert res.success
    checks = {e.check_name: e for e in res.get_asset_check_evaluations()}
    assert set(checks) == {"parse_success_ratio", "quarantine_count", "schema", "no_secrets"}
    assert all(c.passed for c in checks.values()), {k: c.metadata for k, c in checks.items()}

    for name in ("trace_states", "trace_messages", "quarantine"):
        assert (store_root / name / "proj" / "11111111.parquet").is_file()
    store = Store(str(store_root))
    states = store.read_table("trace_states")
    assert states.num_rows == 4  # 3 tool-use steps + the final answer
    assert set(states.column("session_key").to_pylist()) == {session_key}
    raw = store.read_table("trace_messages").column("raw").to_pylist()
    assert not any(FAKE_GITHUB_TOKEN in r for r in raw)

    mats = {m.asset_key.to_user_string(): m for m in res.get_asset_materialization_events()}
    meta = mats["trace_states"].materialization.metadata
    assert meta["dagster/row_count"].value == 4
    assert "Fix the failing test" in meta["rendered_example"].value
    assert meta["ingest_engine"].value == ("native" if native.AVAILABLE else "python")
    assert "python_fallback_reason" not in meta
    assert mats["trace_messages"].materialization.metadata["secrets_scrubbed"].value == {"github_token": 1}
    raw_meta = mats["raw_sessions"].materialization.metadata
    assert raw_meta["n_files"].value == 1 and raw_meta["total_bytes"].value > 0
    assert raw_meta["session_key"].value == session_key
    assert raw_meta["session_file"].value == str(trace_root / "-home-dev-proj" / f"{SESSION_ID}.jsonl")


# fake keys at a line start / after a tab: the positions scrubbing used to miss (issue #12)
LINE_START_KEYS = {
    "openai_key": "sk-proj-" + "Dg4sTeR9Mk2L" * 3,
    "slack_token": "xoxb-1234567890-Dg4sTeRsLaCk77",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJkYWdzdGVyIjoibWV0YSJ9.Dg4sTeRsIgNaTuRe",
    "password_assignment": "password=Dg4sTeRpAsS99",
}


def test_metadata_and_event_log_hold_no_secret(tmp_path):
    """(Partitioned by the long session key, as instances from before short keys are.) Metadata (rendered
    example, previews, counts) and logs are built from the scrubbed ingest tables:
    keys at a line start or after a tab in the session reach no event of the run."""
    root = tmp_path / "projects"
    sid = "22222222-3333-4444-5555-666666666666"
    task = "Use these:\n" + "\n".join(LINE_START_KEYS.values()) + "\n\t" + LINE_START_KEYS["openai_key"]
    d = root / "-home-dev-proj"
    d.mkdir(parents=True)
    (d / f"{sid}.jsonl").write_text("\n".join(session_lines(sid, 3, task=task)) + "\n")
    key = f"-home-dev-proj__{sid}"
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("sessions", [key])
    res = dg.materialize(
        [raw_sessions, ingest_session_tables],
        partition_key=key,
        instance=instance,
        resources={
            "io_manager": ParquetIOManager(root=str(tmp_path / "store")),
            "recipes": PipelineRecipes(trace_root=str(root)),
        },
    )
    assert res.success
    mats = {m.asset_key.to_user_string(): m for m in res.get_asset_materialization_events()}
    assert "[REDACTED:openai_key]" in mats["trace_states"].materialization.metadata["rendered_example"].value
    assert mats["trace_messages"].materialization.metadata["secrets_scrubbed"].value == {
        "openai_key": 2,
        "slack_token": 1,
        "jwt": 1,
        "password_assignment": 1,
        "github_token": 1,
    }
    logs = instance.all_logs(res.run_id)
    assert any("[REDACTED:openai_key]" in str(entry) for entry in logs)  # the metadata is in the log
    fragments = ["Dg4sTeR9Mk2L", "Dg4sTeRsLaCk77", "eyJkYWdzdGVyIjoibWV0YSJ9", "Dg4sTeRpAsS99"]
    for entry in logs:
        assert not any(f in str(entry) for f in fragments), entry.dagster_event_type
