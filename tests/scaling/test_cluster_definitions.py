"""recipes/cluster.yaml loads into Definitions wired for a cluster (no cluster needed).

Checks the executor Dagster would use (k8s_job_executor / celery_executor with the configured
image, namespace, secrets, broker), the trainer's PipesK8sClient and the pod body dagster-k8s would
submit for it (GPU request, torchrun command, secrets, volumes), the S3 store root reaching the IO
manager, and that the default recipe keeps today's single-machine behaviour.
"""

import sys

import dagster as dg
import pytest
from dagster_k8s import PipesK8sClient
from dagster_k8s.pipes import build_pod_body

from assets.definitions import build_defs
from assets.settings import load_settings
from resources.trainer import ENTRY_MODULE, TrainerLauncher


def _executor_config(defs: dg.Definitions) -> dict:
    job = defs.resolve_implicit_global_asset_job_def()
    res = job.executor_def.apply_config_mapping({})
    assert res.success, res.errors
    return job.executor_def.name, res.value["config"]


def test_cluster_recipe_selects_k8s_job_executor(cluster_defs):
    settings, defs = cluster_defs
    assert settings.deployment.executor == "k8s"
    name, cfg = _executor_config(defs)
    assert name == "k8s_job_executor"
    assert cfg["job_image"] == "ghcr.io/your-org/composer-pipeline:0.1.0"
    assert cfg["job_namespace"] == "composer"
    assert cfg["env_secrets"] == ["composer-teacher-keys", "composer-s3"]
    assert "COMPOSER_PIPELINE_RECIPE=recipes/cluster.yaml" in cfg["env_vars"]
    assert cfg["max_concurrent"] == 8
    assert cfg["step_k8s_config"]["pod_spec_config"]["node_selector"] == {"composer/pool": "cpu"}
    # every job of the code location uses it, the named ones too
    for job_name in ("session_chain", "nightly_training"):
        assert defs.resolve_job_def(job_name).executor_def.name == "k8s_job_executor"


def test_cluster_trainer_is_a_k8s_pipes_pod_running_torchrun(cluster_defs):
    _, defs = cluster_defs
    trainer = defs.resources["trainer"]
    assert isinstance(trainer, TrainerLauncher) and trainer.launcher == "k8s"
    assert isinstance(trainer.pipes_k8s_client(), PipesK8sClient)
    cmd = trainer.k8s_command()
    assert cmd == ["torchrun", "--nproc-per-node=1", "-m", ENTRY_MODULE]
    spec = trainer.k8s_pod_spec()
    # the pod body dagster-k8s builds from it (what PipesK8sClient.run submits), with the Pipes env
    body = build_pod_body(
        "dagster-pipes-test", None, cmd, {"DAGSTER_PIPES_CONTEXT": "x", "OMP_NUM_THREADS": "1"}, None, spec
    )
    c = body.spec.containers[0]
    assert c.image == "ghcr.io/your-org/composer-pipeline:0.1.0-cuda" and c.command == cmd
    assert c.resources.requests["nvidia.com/gpu"] == "1" and c.resources.limits["nvidia.com/gpu"] == "1"
    assert c.resources.requests["memory"] == "32Gi"
    assert [e.secret_ref.name for e in c.env_from] == ["composer-s3"]
    assert {e.name for e in c.env} >= {"DAGSTER_PIPES_CONTEXT", "OMP_NUM_THREADS"}
    assert c.volume_mounts[0].mount_path == "/mnt/composer"
    assert body.spec.volumes[0].persistent_volume_claim.claim_name == "composer-state"
    assert body.spec.node_selector == {"composer/pool": "gpu"} and body.spec.restart_policy == "Never"
    assert body.spec.tolerations[0].key == "nvidia.com/gpu"


def test_cluster_store_is_s3_for_io_manager_and_store(cluster_defs):
    settings, defs = cluster_defs
    assert settings.store_root == "s3://composer-pipeline/store"
    io = defs.resources["io_manager"]
    assert io.root == "s3://composer-pipeline/store"
    base = io.create_io_manager(None)._base_path
    assert base.protocol in ("s3", "s3a") and str(base).rstrip("/") == "s3://composer-pipeline/store"
    assert defs.resources["store"].store().is_remote
    assert settings.checkpoints_dir == "/mnt/composer/checkpoints"


def test_cluster_normalize_recipe_selects_ray(cluster_defs):
    from composer_pipeline.pairs.config import NormalizeRecipe

    settings, _ = cluster_defs
    r = NormalizeRecipe.load(settings.recipe("normalize"))
    assert r.executor == "ray" and r.ray_address == "ray://composer-ray-head:10001"
    # same ops as the default recipe: only where they run differs
    assert r.process == NormalizeRecipe.load(None).process


def test_celery_variant_selects_celery_executor(cluster_variant):
    def edit(dep):
        dep["executor"] = "celery"
        dep["celery"] = {
            "broker": "pyamqp://guest@rabbitmq:5672//",
            "backend": "rpc://",
            "include": ["assets.definitions"],
        }

    defs = build_defs(load_settings(cluster_variant(edit)))
    name, cfg = _executor_config(defs)
    assert name == "celery_executor"
    assert cfg["broker"] == "pyamqp://guest@rabbitmq:5672//" and cfg["backend"] == "rpc://"
    assert cfg["include"] == ["assets.definitions"]


def test_multiprocess_variant_and_local_launchers(cluster_variant):
    def edit(dep):
        dep["executor"] = "multiprocess"
        dep["multiprocess"] = {"max_concurrent": 2}
        dep["trainer"] = {"launcher": "accelerate", "accelerate_config": "recipes/accelerate.yaml", "nproc_per_node": 2}

    settings = load_settings(cluster_variant(edit))
    defs = build_defs(settings)
    name, cfg = _executor_config(defs)
    assert name == "multiprocess" and cfg["max_concurrent"] == 2
    trainer = defs.resources["trainer"]
    cmd = trainer.command()
    assert cmd[1:] == [
        "launch",
        "--config_file",
        str(settings.deployment.trainer.accelerate_config),
        "--num_processes",
        "2",
        "-m",
        ENTRY_MODULE,
    ]
    assert cmd[0].endswith("accelerate")


def test_wrong_executor_key_fails_at_load(cluster_variant):
    """A typo in the executor's config is refused by Dagster's schema when the definitions load."""
    from dagster._core.errors import DagsterInvalidConfigError

    def edit(dep):
        dep["k8s"]["job_namespce"] = "typo"

    with pytest.raises(DagsterInvalidConfigError, match="job_namespce"):
        build_defs(load_settings(cluster_variant(edit)))


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda dep: dep.update(executor="spark"), "deployment.executor must be one of"),
        (lambda dep: dep["trainer"].update(launcher="slurm"), "deployment.trainer.launcher must be one of"),
        (lambda dep: dep["trainer"]["k8s"].pop("image"), "k8s.image is not set"),
        (lambda dep: dep["trainer"]["k8s"].update(gpu=1), r"unknown keys \['gpu'\]"),
        (lambda dep: dep.update(exector="k8s"), r"unknown keys \['exector'\]"),
    ],
)
def test_bad_deployment_values_are_clear_errors(cluster_variant, edit, match):
    with pytest.raises(ValueError, match=match):
        load_settings(cluster_variant(edit))


def test_default_recipe_keeps_single_machine_behaviour(repo_root):
    s = load_settings(repo_root / "recipes" / "pipeline.yaml")
    assert s.deployment.executor == "in_process" and s.deployment.trainer.launcher == "subprocess"
    defs = build_defs(s)
    assert defs.resolve_implicit_global_asset_job_def().executor_def is dg.in_process_executor
    assert defs.resources["trainer"].command() == [sys.executable, "-m", ENTRY_MODULE]


def test_k8s_executor_instance_built_from_the_recipe(cluster_defs, tmp_path):
    """Build the executor object Dagster creates at run start (K8sStepHandler) from the recipe's config.

    A kubeconfig naming an API server on 127.0.0.1 that nobody serves stands in for the cluster
    (loading the client makes no request); the step pods' container settings are read back.
    """
    import yaml
    from dagster._config import process_config
    from dagster._core.definitions.job_base import InMemoryJob
    from dagster._core.executor.init import InitExecutorContext
    from dagster_k8s import k8s_job_executor

    _, defs = cluster_defs
    job = defs.resolve_implicit_global_asset_job_def()
    _, cfg = _executor_config(defs)
    kubeconfig = tmp_path / "kubeconfig.yaml"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "t",
                "clusters": [{"name": "t", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}],
                "users": [{"name": "u", "user": {"token": "not-a-secret"}}],
            }
        )
    )
    res = process_config(
        k8s_job_executor.config_schema.config_type,
        {**cfg, "load_incluster_config": False, "kubeconfig_file": str(kubeconfig)},
    )
    assert res.success, res.errors
    executor = k8s_job_executor.executor_creation_fn(
        InitExecutorContext(
            job=InMemoryJob(job),
            executor_def=k8s_job_executor,
            executor_config=res.value,
            instance=dg.DagsterInstance.ephemeral(),
        )
    )
    handler = executor._step_handler  # noqa: SLF001 - what each step pod is built from
    assert type(handler).__name__ == "K8sStepHandler" and executor._max_concurrent == 8  # noqa: SLF001
    ctx = handler._executor_container_context  # noqa: SLF001
    assert handler._executor_image == "ghcr.io/your-org/composer-pipeline:0.1.0"  # noqa: SLF001
    assert ctx.namespace == "composer"
    container = ctx.run_k8s_config.container_config
    assert [e["secret_ref"]["name"] for e in container["env_from"]] == ["composer-teacher-keys", "composer-s3"]
    assert {"name": "COMPOSER_PIPELINE_RECIPE", "value": "recipes/cluster.yaml"} in container["env"]
    assert container["volume_mounts"][0]["mount_path"] == "/mnt/composer"
    assert ctx.run_k8s_config.pod_spec_config["node_selector"] == {"composer/pool": "cpu"}
