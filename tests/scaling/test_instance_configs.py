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
    assert "postgres" in raw["storage"]  # run pods, daemon and webserver share one storage


def test_celery_instance_and_worker_configs_are_valid():
    from dagster_celery import celery_executor
    from dagster_celery.cli import get_config_value_from_yaml

    raw = _instance("dagster.celery.yaml")
    assert "postgres" in raw["storage"]
    worker = get_config_value_from_yaml(str(DIR / "celery_worker.yaml"))  # what `dagster-celery worker -y` reads
    res = process_config(celery_executor.config_schema.config_type, worker)
    assert res.success, res.errors
    assert worker["broker"].startswith("pyamqp://") and worker["include"] == ["assets.definitions"]


@pytest.mark.parametrize("name", ["dagster.k8s.yaml", "dagster.celery.yaml"])
def test_instance_configs_refuse_a_typo(name):
    """The schema check above is not vacuous: an unknown top-level key fails it."""
    raw = yaml.safe_load((DIR / name).read_text())
    raw["run_launcherr"] = {}
    assert not process_config(dagster_instance_config_schema(), raw).success
