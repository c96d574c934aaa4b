"""recipes/dagster/*.yaml (what users copy to $DAGSTER_HOME/dagster.yaml) are valid for this Dagster.

Validated with Dagster's own instance schema and the run launcher's / executor's config schema;
the K8sRunLauncher class named in the file is imported from where the file says it lives.
"""

import importlib
from pathlib import Path

import pytest
import yaml
from dagster._config import process_config
from dagster._core.instance.config import dagster_instance_config_schema

REPO = Path(__file__).resolve().parents[2]
DIR = REPO / "recipes" / "dagster"


@pytest.fixture(autouse=True)
def _deployment_env(monkeypatch):
    """The variables the files read with {env: ...}; a real deployment sets them from Secrets."""
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", "from-a-secret")
    monkeypatch.setenv("DAGSTER_PG_HOST", "dagster-postgresql")
    monkeypatch.setenv("DAGSTER_PG_PORT", "5432")
    monkeypatch.setenv("DAGSTER_PG_USER", "dagster")
    monkeypatch.setenv("DAGSTER_PG_DB", "dagster")


def _instance(name: str) -> dict:
    raw = yaml.safe_load((DIR / name).read_text())
    res = process_config(dagster_instance_config_schema(), raw)
    assert res.success, res.errors
    return raw


def test_k8s_run_launcher_instance_config_is_valid():
    raw = _instance("dagster.k8s.yaml")
    rl = raw["run_launcher"]
    cls = getattr(importlib.import_module(rl["module"]), rl["class"])
    assert cls.__name__ == "K8sRunLauncher"
    res = process_config(cls.config_type(), rl["config"])
    assert res.success, res.errors
    assert res.value["job_namespace"] == "composer" and res.value["instance_config_map"] == "dagster-instance"
    assert res.value["env_secrets"] == ["composer-teacher-keys", "composer-s3"]
    # run pods, daemon and webserver share one storage
    assert "postgres" in raw["storage"]


def test_celery_instance_and_worker_configs_are_valid():
    from dagster_celery import celery_executor
    from dagster_celery.cli import get_config_value_from_yaml

    raw = _instance("dagster.celery.yaml")
    assert "postgres" in raw["storage"]
    worker = get_config_value_from_yaml(str(DIR / "celery_worker.yaml"))  # what `dagster-celery worker -y` reads
    res = process_config(celery_executor.config_schema.config_type, worker)
    assert res.success, res.errors
    assert worker["broker"].startswith("pyamqp://") and worker["include"] == ["assets.definitions"]


@pytest.mark.parametrize("name", ["dagster.k8s.yaml", "dagster.celery.yaml", "dagster.postgres.yaml"])
def test_instance_configs_refuse_a_typo(name):
    """The schema check above is not vacuous: an unknown top-level key fails it."""
    raw = yaml.safe_load((DIR / name).read_text())
    raw["run_launcherr"] = {}
    assert not process_config(dagster_instance_config_schema(), raw).success


def test_postgres_instance_config_is_valid():
    raw = _instance("dagster.postgres.yaml")
    db = raw["storage"]["postgres"]["postgres_db"]
    assert db["scheme"] == "postgresql+psycopg2" and db["password"] == {"env": "DAGSTER_PG_PASSWORD"}


@pytest.mark.slow
def test_postgres_instance_materializes_against_a_real_server(postgres_server, tmp_path, monkeypatch):
    """recipes/dagster/dagster.postgres.yaml as $DAGSTER_HOME/dagster.yaml on a real PostgreSQL server:
    a session partition materializes through the ingest chain, the run and its materializations are
    rows in that database, and a second instance opened from the same file (another process's view)
    sees them."""
    import shutil

    import dagster as dg
    import psycopg2

    from assets.ingest import ingest_session_tables, raw_sessions
    from resources.recipes import PipelineRecipes
    from resources.storage import ParquetIOManager

    url = postgres_server.create_database("dagster_instance_test")
    for var, value in {
        "DAGSTER_PG_HOST": "127.0.0.1",
        "DAGSTER_PG_PORT": str(postgres_server.port),
        "DAGSTER_PG_USER": "postgres",
        "DAGSTER_PG_PASSWORD": "",
        "DAGSTER_PG_DB": "dagster_instance_test",
    }.items():
        monkeypatch.setenv(var, value)
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(DIR / "dagster.postgres.yaml", home / "dagster.yaml")
    samples = REPO / "composer_pipeline" / "samples" / "projects"
    from composer_pipeline.ingest.discover import discover_sessions

    key = next(s.key for s in discover_sessions(samples) if "b2e1d4c3" in s.key)

    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        instance.add_dynamic_partitions("sessions", [key])
        res = dg.materialize(
            [raw_sessions, ingest_session_tables],
            partition_key=key,
            instance=instance,
            resources={
                "io_manager": ParquetIOManager(root=str(tmp_path / "store")),
                "recipes": PipelineRecipes(trace_root=str(samples)),
            },
        )
        assert res.success
        run_id = res.run_id

    with dg.DagsterInstance.from_config(str(home)) as other:
        assert other.get_run_by_id(run_id).is_success
        event = other.get_latest_materialization_event(dg.AssetKey("trace_states"))
        assert event is not None and event.run_id == run_id
        assert other.get_dynamic_partitions("sessions") == [key]

    conn = psycopg2.connect(url)
    with conn, conn.cursor() as cur:
        cur.execute("select status from runs where run_id = %s", (run_id,))
        assert cur.fetchone() == ("SUCCESS",)
        cur.execute(
            "select count(*) from event_logs where run_id = %s and dagster_event_type = 'ASSET_MATERIALIZATION'",
            (run_id,),
        )
        # raw_sessions, trace_states, trace_messages, quarantine
        assert cur.fetchone()[0] >= 4
    conn.close()
