"""The replay's requests are built once per Dagster run: `cost_plan` prepares them, `teacher_replays` of the
same run reads them back (replay/front.py) instead of rendering, fitting and hashing every state again.
A run of `teacher_replays` alone prepares once for itself; a file that is not what the checked plan priced
is never used."""

import dagster as dg
from dagster_sessions import SESSION_ID, write_teachers_yaml

import composer_pipeline.replay.run as replay
from assets.ingest import ingest_session_tables, raw_sessions
from assets.replay import cost_plan, cost_plan_within_budget, teacher_replays
from composer_pipeline.store import Store
from resources.ledger import LedgerResource
from resources.recipes import PipelineRecipes
from resources.storage import ParquetIOManager
from resources.teachers import TeachersResource

KEY = f"-home-dev-proj__{SESSION_ID}"
CHAIN = [raw_sessions, ingest_session_tables, cost_plan, cost_plan_within_budget, teacher_replays]


def _count_builds(monkeypatch) -> list[int]:
    builds = []
    real = replay.build_requests

    def counted(states, *a, **kw):
        builds.append(states.num_rows)
        return real(states, *a, **kw)

    monkeypatch.setattr(replay, "build_requests", counted)
    return builds


def test_requests_are_built_once_per_run(trace_root, tmp_path, scripted_server, monkeypatch):
    builds = _count_builds(monkeypatch)
    teachers_yaml = write_teachers_yaml(tmp_path / "teachers.yaml", scripted_server.url)
    teachers = TeachersResource(recipe=str(teachers_yaml), cache_dir=str(tmp_path / "cache"))
    resources = {
        "io_manager": ParquetIOManager(root=str(tmp_path / "store")),
        "recipes": PipelineRecipes(trace_root=str(trace_root)),
        "teachers": teachers,
        "ledger": LedgerResource(path=str(tmp_path / "ledger.sqlite")),
    }
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("sessions", [KEY])
    res = dg.materialize(CHAIN, partition_key=KEY, instance=instance, resources=resources)
    assert res.success
    store = Store(str(tmp_path / "store"))
    states, replays = store.read_table("trace_states"), store.read_table("teacher_replays")
    # cost_plan built them; teacher_replays read them back
    assert builds == [states.num_rows]
    assert set(replays.column("status").to_pylist()) == {"answered"}
    assert len(scripted_server.requests) == replays.num_rows == 3 * states.num_rows
    # what was sent is what the checked plan priced: the same call ids, in the plan's order
    assert replays.column("call_id").to_pylist() == store.read_table("cost_plan").column("call_id").to_pylist()
    # the file was read once and removed (nothing of the run is left behind)
    assert not any(p.is_file() for p in (tmp_path / "prepared_requests").rglob("*"))

    # teacher_replays alone, in another run: no prepared file of that run, so it prepares once itself
    sent = len(scripted_server.requests)
    again = dg.materialize(
        CHAIN,
        partition_key=KEY,
        instance=instance,
        resources=resources,
        selection=[teacher_replays.key],
    )
    assert again.success and builds == [states.num_rows, states.num_rows]
    # every answer cached: nothing bought twice
    assert len(scripted_server.requests) == sent


def test_a_prepared_file_that_the_plan_did_not_price_is_not_used(tmp_path):
    """load_prepared returns the run only when its call ids are the checked plan's; else None (prepare again)."""
    import pyarrow as pa

    from composer_pipeline.render import RenderOptions
    from composer_pipeline.replay.front import load_prepared, prepared_path, save_prepared
    from composer_pipeline.replay.run import ReplayRun
    from composer_pipeline.teachers.config import parse_teachers
    from tests.pairs.conftest import session_tables

    t = session_tables.__wrapped__()
    teacher = dict(name="a", base_url="http://127.0.0.1:1/v1", model="m", api_key_env=None, input_usd_per_mtok=1.0,
                   output_usd_per_mtok=1.0, budget_usd=1.0, max_concurrency=1, max_tokens=64)  # fmt: skip
    cfg = parse_teachers({"ceiling_usd": 1.0, "teachers": [teacher]}, "t")
    run = ReplayRun.prepare(t["trace_states"], t["trace_messages"], cfg, RenderOptions())
    ids = [r.call_id for r in run.requests]
    path = prepared_path(tmp_path, "run-1", "proj/abc")
    save_prepared(run, path)
    back = load_prepared(path, cfg, pa.table({"call_id": ids}))
    assert back is not None and [r.body for r in back.requests] == [r.body for r in run.requests]
    assert [r.call_id for r in back.requests] == ids and back.unrendered == run.unrendered
    assert not path.exists()  # read once
    save_prepared(run, path)
    assert load_prepared(path, cfg, pa.table({"call_id": ids[::-1] + ["other"]})) is None  # not what was priced
    save_prepared(run, path)
    other = parse_teachers({"ceiling_usd": 1.0, "teachers": [{**teacher, "input_usd_per_mtok": 2.0}]}, "t")
    assert load_prepared(path, other, pa.table({"call_id": ids})) is None  # prepared for another teacher identity
