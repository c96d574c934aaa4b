"""One default ledger and response cache for the CLI and the Dagster assets (issue 23).

On a checkout-like layout (the repo's own ``recipes/pipeline.yaml``, nothing passed for the ledger or
the cache, ``$COMPOSER_PIPELINE_HOME`` a fresh directory): a CLI replay, then a Dagster run of the same
states on a real ephemeral instance, against a real loopback teacher server. Every answer is bought
once; ``teachers budget`` without ``--ledger`` reads the ledger both spent against.
"""

import os
import subprocess
import sys

import dagster as dg
import orjson
import pytest
from dagster_sessions import SESSION_ID, write_teachers_yaml

from assets.definitions import build_resources
from assets.ingest import ingest_session_tables, raw_sessions
from assets.replay import cost_plan, cost_plan_within_budget, teacher_replays
from assets.settings import REPO_ROOT, load_settings
from composer_pipeline.store import Store

KEY = f"-home-dev-proj__{SESSION_ID}"


def _cli(*args, env):
    res = subprocess.run(
        [sys.executable, "-m", "composer_pipeline", *map(str, args)],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return [orjson.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_cli_replay_and_dagster_run_buy_each_answer_once(trace_root, tmp_path, scripted_server, monkeypatch):
    home = tmp_path / "home"
    teachers = write_teachers_yaml(tmp_path / "teachers.yaml", scripted_server.url)
    for name in ("COMPOSER_LEDGER_URL", "COMPOSER_PIPELINE_RECIPE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COMPOSER_PIPELINE_HOME", str(home))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}

    cli = tmp_path / "cli"
    _cli("ingest", trace_root, "--out", cli, env=env)
    _cli(
        "replay",
        "--states",
        cli,
        "--teachers",
        teachers,
        "--out",
        cli,
        "--ingest-recipe",
        REPO_ROOT / "recipes" / "ingest.yaml",
        env=env,
    )
    bought = len(scripted_server.requests)
    n_states = Store(str(cli)).read_table("trace_states").num_rows
    assert bought == 3 * n_states > 0

    monkeypatch.setenv("COMPOSER_TRACE_ROOT", str(trace_root))
    monkeypatch.setenv("COMPOSER_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("COMPOSER_TEACHERS_RECIPE", str(teachers))
    # the repo's recipes/pipeline.yaml: ledger_path and cache_dir left to the default
    settings = load_settings()
    assert settings.ledger_path == str(home / "ledger.sqlite")
    assert settings.cache_dir == str(home / "teacher_cache")
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("sessions", [KEY])
    res = dg.materialize(
        [raw_sessions, ingest_session_tables, cost_plan, cost_plan_within_budget, teacher_replays],
        partition_key=KEY,
        instance=instance,
        resources=build_resources(settings),
    )
    assert res.success
    # the Dagster run bought nothing the CLI had bought
    assert len(scripted_server.requests) == bought
    replays = Store(str(tmp_path / "store")).read_table("teacher_replays")
    assert replays.num_rows == bought and all(replays.column("cache_hit").to_pylist())
    assert sum(replays.column("paid_usd").to_pylist()) == 0

    cli_spend = sum(Store(str(cli)).read_table("replays").column("paid_usd").to_pylist())
    budgets = _cli("teachers", "budget", "--teachers", teachers, env=env)  # no --ledger: the same default
    assert len(budgets) == 3
    assert abs(sum(b["settled_usd"] for b in budgets) - cli_spend) < 1e-6 and cli_spend > 0
