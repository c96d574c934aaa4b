"""sessions_sensor: adds a partition per new session and re-requests changed sessions (run_key = key:fingerprint)."""

import json
import os

import dagster as dg
from dagster_sessions import write_session

from assets.definitions import session_chain_job
from assets.partitions import sessions_partitions
from assets.sensors import build_sessions_sensor
from resources.recipes import PipelineRecipes


def _tick(sensor, instance, cursor, root):
    ctx = dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"recipes": PipelineRecipes(trace_root=str(root))}
    )
    result = sensor(ctx)
    if isinstance(result, dg.SkipReason):
        return result, [], [], cursor
    added = [k for req in result.dynamic_partitions_requests for k in req.partition_keys]
    if added:
        instance.add_dynamic_partitions(sessions_partitions.name, added)
    return result, added, result.run_requests, result.cursor


def test_sensor_adds_new_and_rerequests_changed(tmp_path):
    root = tmp_path / "projects"
    write_session(root, "-home-dev-a", "aaaaaaaa-0000-0000-0000-000000000001")
    sensor = build_sessions_sensor(session_chain_job, 30)
    instance = dg.DagsterInstance.ephemeral()

    _, added, runs, cursor = _tick(sensor, instance, None, root)
    key_a = "a/aaaaaaaa"  # short and readable: <project>/<id>
    assert added == [key_a]
    assert [r.partition_key for r in runs] == [key_a]
    assert runs[0].run_key.startswith(key_a + ":")
    first_run_key = runs[0].run_key
    assert instance.get_dynamic_partitions("sessions") == [key_a]

    # nothing changed: skip
    skip, added, runs, cursor = _tick(sensor, instance, cursor, root)
    assert isinstance(skip, dg.SkipReason) and not runs

    # a new session appears, the old one grows
    write_session(root, "-home-dev-b", "bbbbbbbb-0000-0000-0000-000000000002")
    pa_ = root / "-home-dev-a" / "aaaaaaaa-0000-0000-0000-000000000001.jsonl"
    with pa_.open("a") as f:
        f.write('{"type":"summary","summary":"later"}\n')
    os.utime(pa_, ns=(pa_.stat().st_atime_ns, pa_.stat().st_mtime_ns + 10**9))
    _, added, runs, cursor = _tick(sensor, instance, cursor, root)
    key_b = "b/bbbbbbbb"
    assert added == [key_b]
    assert sorted(r.partition_key for r in runs) == [key_a, key_b]
    assert sorted(instance.get_dynamic_partitions("sessions")) == [key_a, key_b]
    new_a = next(r.run_key for r in runs if r.partition_key == key_a)
    assert new_a.startswith(key_a + ":") and new_a != first_run_key  # fingerprint changed -> new run


def test_sensor_skips_with_reason_when_trace_root_missing(tmp_path):
    sensor = build_sessions_sensor(session_chain_job, 30)
    result, added, runs, _ = _tick(sensor, dg.DagsterInstance.ephemeral(), None, tmp_path / "nope")
    assert isinstance(result, dg.SkipReason) and "does not exist" in result.skip_message
    assert not added and not runs


def test_first_tick_requests_no_run_for_sessions_already_materialized(tmp_path):
    """A fresh sensor cursor (first tick, or the sensor turned on after the demo) must not re-run
    sessions whose files were already materialized as they are; a new or later-changed one runs.
    The partitions here have the long keys of an instance from before short keys: they keep
    working, and their sessions get no second, short partition."""
    from assets.ingest import raw_sessions

    root = tmp_path / "projects"
    write_session(root, "-home-dev-a", "aaaaaaaa-0000-0000-0000-000000000001")
    write_session(root, "-home-dev-b", "bbbbbbbb-0000-0000-0000-000000000002")
    key_a = "-home-dev-a__aaaaaaaa-0000-0000-0000-000000000001"
    key_b = "-home-dev-b__bbbbbbbb-0000-0000-0000-000000000002"
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(sessions_partitions.name, [key_a, key_b])
    recipes = PipelineRecipes(trace_root=str(root))
    for key in (key_a, key_b):
        assert dg.materialize(
            [raw_sessions], partition_key=key, instance=instance, resources={"recipes": recipes}
        ).success
    # a's chain went through to its last asset; b's stopped after raw_sessions (e.g. a failed cost check)
    instance.report_runless_asset_event(dg.AssetMaterialization("normalized_dpo_pairs", partition=key_a))

    sensor = build_sessions_sensor(session_chain_job, 30)
    _, added, runs, cursor = _tick(sensor, instance, None, root)
    assert added == [] and [r.partition_key for r in runs] == [key_b]  # a: done already, no run; b: unfinished
    assert key_a in json.loads(cursor)
    skip, _, runs, cursor = _tick(sensor, instance, cursor, root)
    assert isinstance(skip, dg.SkipReason) and not runs
    # a materialized session whose file changed since is a changed session: it runs
    pa_ = root / "-home-dev-a" / "aaaaaaaa-0000-0000-0000-000000000001.jsonl"
    with pa_.open("a") as f:
        f.write('{"type":"summary","summary":"later"}\n')
    os.utime(pa_, ns=(pa_.stat().st_atime_ns, pa_.stat().st_mtime_ns + 10**9))
    _, _, runs, _ = _tick(sensor, instance, None, root)  # even with a reset cursor
    assert sorted(r.partition_key for r in runs) == [key_a, key_b]


def test_a_newcomer_sharing_an_id_prefix_gets_a_longer_key_and_the_old_partition_keeps_its_session(tmp_path):
    """Collision -> longer id for the newcomer; the older key still names the session it was
    materialized as (raw_sessions records the full session key and file)."""
    from assets.ingest import raw_sessions

    root = tmp_path / "projects"
    write_session(root, "-home-dev-a", "aaaaaaaa-0000-0000-0000-000000000001")
    sensor = build_sessions_sensor(session_chain_job, 30)
    instance = dg.DagsterInstance.ephemeral()
    recipes = PipelineRecipes(trace_root=str(root))
    _, added, runs, cursor = _tick(sensor, instance, None, root)
    assert added == ["a/aaaaaaaa"]
    res = dg.materialize([raw_sessions], partition_key="a/aaaaaaaa", instance=instance, resources={"recipes": recipes})
    meta = res.asset_materializations_for_node("raw_sessions")[0].metadata
    assert meta["session_key"].value == "-home-dev-a__aaaaaaaa-0000-0000-0000-000000000001"
    assert meta["session_file"].value.endswith("-home-dev-a/aaaaaaaa-0000-0000-0000-000000000001.jsonl")

    # a session whose id starts with the same 8 characters and sorts before the first one
    write_session(root, "-home-dev-a", "aaaaaaaa-0000-0000-0000-000000000000")
    _, added, runs, cursor = _tick(sensor, instance, cursor, root)
    assert added == ["a/aaaaaaaa-0000-0000-0000-000000000000"]  # the first character that differs
    assert [r.partition_key for r in runs] == added
    res = dg.materialize([raw_sessions], partition_key="a/aaaaaaaa", instance=instance, resources={"recipes": recipes})
    assert res.asset_materializations_for_node("raw_sessions")[0].metadata["session_key"].value.endswith("0001")
    res = dg.materialize([raw_sessions], partition_key=added[0], instance=instance, resources={"recipes": recipes})
    assert res.asset_materializations_for_node("raw_sessions")[0].metadata["session_key"].value.endswith("0000")


def test_sensor_description_names_the_folder_it_watches(tmp_path, monkeypatch):
    from assets.definitions import build_defs
    from assets.settings import load_settings

    monkeypatch.setenv("COMPOSER_TRACE_ROOT", str(tmp_path / "projects"))
    defs = build_defs(load_settings())
    sensor = defs.resolve_sensor_def("sessions_sensor")
    assert f"Watches `{tmp_path / 'projects'}`" in sensor.description
