"""A key in a session's cwd (Claude Code names the project folder after it) reaches no partition key, store
path, metadata or event of a Dagster run (issue 21: ids derived from paths are scrubbed too)."""

import dagster as dg
from dagster_sessions import session_lines

from assets.ingest import ingest_session_tables, raw_sessions
from composer_pipeline.ingest.discover import discover_sessions
from composer_pipeline.ingest.partition_keys import KeyMap
from resources.recipes import PipelineRecipes
from resources.storage import ParquetIOManager

KEY = "AKIA" + "CWDFOLDERKEY7Q2Z"  # fake; /home/dev/<KEY> as a cwd


def test_a_key_in_the_project_folder_reaches_no_partition_path_or_event(tmp_path):
    root = tmp_path / "projects"
    sid = "33333333-4444-4555-8666-777777777777"
    d = root / f"-home-dev-{KEY}"
    d.mkdir(parents=True)
    (d / f"{sid}.jsonl").write_text("\n".join(session_lines(sid, 2)) + "\n")
    (sf,) = discover_sessions(root)
    assert KEY not in sf.key and "[REDACTED:aws_access_key]~" in sf.key
    (pk,) = KeyMap([sf.key]).assign().values()
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("sessions", [pk])
    store = tmp_path / "store"
    res = dg.materialize(
        [raw_sessions, ingest_session_tables],
        partition_key=pk,
        instance=instance,
        resources={"io_manager": ParquetIOManager(root=str(store)), "recipes": PipelineRecipes(trace_root=str(root))},
    )
    assert res.success
    assert KEY not in pk and (store / "trace_states" / f"{pk}.parquet").is_file()
    assert not [p for p in store.rglob("*") if KEY in str(p)]
    fragment = KEY[4:]
    logs = instance.all_logs(res.run_id)
    assert logs and not [e.dagster_event_type for e in logs if fragment in str(e)]
    run = instance.get_run_by_id(res.run_id)
    assert fragment not in str(run.tags)
