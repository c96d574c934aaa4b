"""One replay entry and one summary for the CLI and the assets (issue 23).

A CLI replay buys every answer from a real loopback teacher server; a Dagster run of the same session
(real ephemeral instance, same ledger and response cache) and a second CLI replay then answer the same
state × teacher rows from the cache. The summary the CLI prints and the ``summary`` metadata of
``teacher_replays`` are then the same dict (run_report.replay_summary), under one set of key names; the
CLI adds where it wrote and the older names of the same numbers only.
"""

import dagster as dg
import orjson
from dagster_sessions import SESSION_ID, write_teachers_yaml

from assets.ingest import ingest_session_tables, raw_sessions
from assets.replay import cost_plan, cost_plan_within_budget, teacher_replays
from assets.settings import REPO_ROOT
from composer_pipeline.cli import main
from composer_pipeline.replay.report import CLI_LEGACY_KEYS
from composer_pipeline.store import Store
from resources.ledger import LedgerResource
from resources.recipes import PipelineRecipes
from resources.storage import ParquetIOManager
from resources.teachers import TeachersResource

KEY = f"-home-dev-proj__{SESSION_ID}"
INGEST = str(REPO_ROOT / "recipes" / "ingest.yaml")
CLI_ONLY = {"run_id", "out", "ledger", "cache", "predicted_vs_billed", *CLI_LEGACY_KEYS}


def _cli(capsys, *argv) -> dict:
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return orjson.loads(out.out.strip().splitlines()[-1])


def test_cli_and_asset_print_the_same_summary(trace_root, tmp_path, scripted_server, capsys):
    teachers = write_teachers_yaml(tmp_path / "teachers.yaml", scripted_server.url)
    ledger, cache, cli = tmp_path / "ledger.sqlite", tmp_path / "cache", tmp_path / "cli"
    common = ["--teachers", teachers, "--ingest-recipe", INGEST, "--ledger", ledger, "--cache", cache]
    capsys.readouterr()
    assert main(["ingest", str(trace_root), "--out", str(cli), "--recipe", INGEST]) == 0
    bought = _cli(capsys, "replay", "--states", cli, "--out", cli, *common)
    n = len(scripted_server.requests)
    assert n == bought["rows"] == bought["http_requests"] == bought["calls"] > 0 and bought["from_cache"] == 0

    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("sessions", [KEY])
    res = dg.materialize(
        [raw_sessions, ingest_session_tables, cost_plan, cost_plan_within_budget, teacher_replays],
        partition_key=KEY,
        instance=instance,
        resources={
            "io_manager": ParquetIOManager(root=str(tmp_path / "store")),
            "recipes": PipelineRecipes(trace_root=str(trace_root), ingest=INGEST),
            "teachers": TeachersResource(recipe=str(teachers), cache_dir=str(cache)),
            "ledger": LedgerResource(path=str(ledger)),
        },
    )
    # the same requests: all answered by the cache
    assert res.success and len(scripted_server.requests) == n
    meta = {m.asset_key.to_user_string(): m.materialization.metadata for m in res.get_asset_materialization_events()}
    asset = meta["teacher_replays"]["summary"].value

    again = _cli(capsys, "replay", "--states", cli, "--out", tmp_path / "cli2", *common)
    assert len(scripted_server.requests) == n
    cols = ["call_id", "status", "cache_hit", "latency_s", "action"]
    key = lambda r: r["call_id"]  # noqa: E731
    assert sorted(Store(str(tmp_path / "store")).read_table("teacher_replays", cols).to_pylist(), key=key) == sorted(
        Store(str(tmp_path / "cli2")).read_table("teacher_replays", cols).to_pylist(), key=key
    )
    # one table name: the CLI's file keeps its short name for scripts, every reader sees the asset's
    assert again["out"] == str(tmp_path / "cli2" / "replays.parquet")
    assert {"teacher_replays", "cost_plan"} <= set(
        Store(str(tmp_path / "cli2")).table_names()
    ) and "replays" not in Store(str(tmp_path / "cli2")).table_names()

    # one dict, one set of names: the CLI prints the asset's summary plus where it wrote and the old names
    assert set(again) - set(asset) == CLI_ONLY and set(asset) <= set(again)
    assert {k: again[k] for k in asset} == asset
    assert (asset["rows"], asset["from_cache"], asset["http_requests"], asset["spend_usd"]) == (n, n, 0, 0)
    assert asset["latency_s_cached"]["n"] == n and asset["latency_s_http"] == {"n": 0}
    # the old names carry the same numbers
    assert (again["calls"], again["cache_hits"], again["total_spend"], again["attempts"]) == (0, n, 0, 0)
    assert again["spend_by_teacher"] == asset["spend_usd_by_teacher"] == {"t0": 0.0, "t1": 0.0, "t2": 0.0}
    assert again["latency_p50_s"] is None and bought["latency_p50_s"] == bought["latency_s_http"]["p50"]
    # the asset's plotted numbers are the summary's, under its names (no recount)
    top = {k: v.value for k, v in meta["teacher_replays"].items()}
    assert (top["http_requests"], top["from_cache"], top["spend_usd"]) == (0, n, 0)
    assert top["spend_usd_by_teacher"] == asset["spend_usd_by_teacher"] and top["failures_by_reason"] == {}
