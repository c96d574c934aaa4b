"""Pick the Dagster executor named by ``deployment.executor`` in ``recipes/pipeline.yaml``.

In: ``PipelineSettings``. Out: an ``ExecutorDefinition`` for ``dg.Definitions(executor=...)``:

* ``in_process`` (default): every step in the run's process (cheapest here: no subprocess per step);
* ``multiprocess``: a subprocess per step (``deployment.multiprocess``: ``max_concurrent``, ...);
* ``k8s``: ``dagster_k8s.k8s_job_executor``, a Kubernetes Job per step (``deployment.k8s``:
  ``job_image``, ``job_namespace``, ``env_secrets``, ``max_concurrent``, ``step_k8s_config``...);
* ``celery``: ``dagster_celery.celery_executor``, steps as Celery tasks on workers started with
  ``dagster-celery worker start -A dagster_celery.app`` (``deployment.celery``: ``broker``, ``backend``, ``include``).

The optional packages are imported only when chosen. The config is handed to Dagster's
``.configured(...)`` unchanged, so Dagster's own schema rejects a wrong key when the definitions load.
"""

import dagster as dg

from assets.settings import PipelineSettings


def build_executor(settings: PipelineSettings) -> dg.ExecutorDefinition:
    executor = _select(settings)
    # .configured() defers validation to the first run
    checked = executor.apply_config_mapping({})
    if not checked.success:
        raise dg.DagsterInvalidConfigError(
            f"recipes: deployment.{settings.deployment.executor} is not valid {executor.name} config",
            checked.errors,
            settings.deployment.executor_config,
        )
    return executor


def _select(settings: PipelineSettings) -> dg.ExecutorDefinition:
    dep = settings.deployment
    cfg = dict(dep.executor_config)
    if dep.executor == "in_process":
        return dg.in_process_executor.configured(cfg) if cfg else dg.in_process_executor
    if dep.executor == "multiprocess":
        return dg.multiprocess_executor.configured(cfg) if cfg else dg.multiprocess_executor
    if dep.executor == "k8s":
        try:
            from dagster_k8s import k8s_job_executor
        except ImportError as e:  # pragma: no cover - pinned in pyproject.toml
            raise ImportError("deployment.executor: k8s needs the dagster-k8s package") from e
        return k8s_job_executor.configured(cfg, name="k8s_job_executor")
    if dep.executor == "celery":
        try:
            from dagster_celery import celery_executor
        except ImportError as e:  # pragma: no cover - pinned in pyproject.toml
            raise ImportError("deployment.executor: celery needs the dagster-celery package") from e
        return celery_executor.configured(cfg, name="celery_executor")
    raise ValueError(f"unknown executor {dep.executor!r}")
