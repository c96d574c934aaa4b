"""A Claude Code root and a Codex CLI root watched by one sensor; a Codex partition ingested through Dagster."""

import dagster as dg
from dagster_sessions import SESSION_ID, write_session

from assets.definitions import session_chain_job
from assets.ingest import ingest_session_tables, raw_sessions
from assets.partitions import sessions_partitions
from assets.sensors import build_sessions_sensor
from composer_pipeline.store import Store
from resources.recipes import PipelineRecipes
from resources.storage import ParquetIOManager
from tests.ingest import codex_fixtures as fx


def test_sensor_watches_every_root_and_a_codex_partition_ingests(tmp_path):
    claude_root, codex_root = tmp_path / "projects", tmp_path / "codex_sessions"
    write_session(claude_root, "-home-dev-proj", SESSION_ID)
    fx.write(codex_root, "exec")
    recipes = PipelineRecipes(trace_roots=[str(claude_root), str(codex_root), str(tmp_path / "absent")])
    instance = dg.DagsterInstance.ephemeral()
    sensor = build_sessions_sensor(session_chain_job, 30, recipes.trace_roots)
    result = sensor(dg.build_sensor_context(instance=instance, resources={"recipes": recipes}))
    added = sorted(k for req in result.dynamic_partitions_requests for k in req.partition_keys)
    codex_key = "codex/" + fx.SESSION_IDS["exec"][:8]
    assert added == [codex_key, "proj/11111111"]
    assert sorted(r.partition_key for r in result.run_requests) == added
    instance.add_dynamic_partitions(sessions_partitions.name, added)

    store_root = tmp_path / "store"
    res = dg.materialize(
        [raw_sessions, ingest_session_tables],
        partition_key=codex_key,
        instance=instance,
        resources={"io_manager": ParquetIOManager(root=str(store_root)), "recipes": recipes},
    )
    assert res.success
    checks = {e.check_name: e for e in res.get_asset_check_evaluations()}
    assert all(c.passed for c in checks.values()), {k: c.metadata for k, c in checks.items()}
    store = Store(str(store_root))
    states = store.read_table("trace_states")
    assert states.num_rows == fx.STEPS["exec"] and set(states.column("source").to_pylist()) == {"codex"}
    raw = "".join(store.read_table("trace_messages").column("raw").to_pylist())
    for key in fx.PLANTED:
        assert key not in raw
