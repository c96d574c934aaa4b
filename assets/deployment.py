"""The ``deployment`` section of ``recipes/pipeline.yaml``: where steps and the trainer run.

In: the ``deployment`` mapping (or nothing). Out: a frozen ``DeploymentSettings`` that
``assets/executors.py`` (Dagster executor) and ``resources/trainer.py`` (Pipes launcher) read.
Missing keys keep the single-machine defaults: ``executor: in_process``, ``trainer.launcher:
subprocess``. Simplified: the executor's own config (``k8s``/``celery``/``multiprocess``) is
passed to Dagster as written, so Dagster's schema validates it (a typo fails at load time);
only the names of the choices are checked here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXECUTORS = ("in_process", "multiprocess", "k8s", "celery")
LAUNCHERS = ("subprocess", "torchrun", "accelerate", "k8s")
IN_POD = ("python", "torchrun", "accelerate")  # what the trainer pod runs
_TRAINER_KEYS = {"launcher", "nproc_per_node", "torchrun_args", "accelerate_config", "env", "k8s"}
_K8S_TRAINER_KEYS = {
    "image", "namespace", "command", "nproc_per_node", "accelerate_config", "gpus", "resources", "env",
    "env_secrets", "node_selector", "tolerations", "volumes", "volume_mounts", "service_account_name",
    "image_pull_policy", "load_incluster_config", "kubeconfig_file", "poll_interval_s",
}


def _check(section: str, given: dict, allowed: set) -> None:
    unknown = set(given) - allowed
    if unknown:
        raise ValueError(f"pipeline recipe: deployment.{section}: unknown keys {sorted(unknown)}")


@dataclass(frozen=True)
class TrainerDeployment:
    """How ``trained_policy`` starts the trainer (``resources/trainer.py``)."""

    launcher: str = "subprocess"              # subprocess | torchrun | accelerate | k8s
    nproc_per_node: int = 1                   # torchrun / accelerate processes on this machine
    torchrun_args: tuple[str, ...] = ()       # multi-node rendezvous flags for torchrun; empty: --standalone
    accelerate_config: str | None = None      # `accelerate launch --config_file` (absolute path)
    env: dict[str, str] = field(default_factory=dict)
    k8s: dict[str, Any] = field(default_factory=dict)  # pod of the Pipes trainer (launcher: k8s)

    @classmethod
    def from_dict(cls, d: dict | None, repo_root: Path) -> "TrainerDeployment":
        d = dict(d or {})
        _check("trainer", d, _TRAINER_KEYS)
        launcher = str(d.get("launcher") or "subprocess")
        if launcher not in LAUNCHERS:
            raise ValueError(f"pipeline recipe: deployment.trainer.launcher must be one of {LAUNCHERS}, got {launcher!r}")
        k8s = dict(d.get("k8s") or {})
        _check("trainer.k8s", k8s, _K8S_TRAINER_KEYS)
        inner = str(k8s.get("command") or "python")
        if inner not in IN_POD:
            raise ValueError(f"pipeline recipe: deployment.trainer.k8s.command must be one of {IN_POD}, got {inner!r}")
        if launcher == "k8s" and not k8s.get("image"):
            raise ValueError("pipeline recipe: deployment.trainer.launcher is k8s but deployment.trainer.k8s.image is not set")
        acc = d.get("accelerate_config")
        if acc and "://" not in str(acc):
            p = Path(os.path.expanduser(str(acc)))
            acc = str(p if p.is_absolute() else (repo_root / p).resolve())
        nproc = int(d.get("nproc_per_node") or 1)
        if nproc < 1:
            raise ValueError("pipeline recipe: deployment.trainer.nproc_per_node must be >= 1")
        args = d.get("torchrun_args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError("pipeline recipe: deployment.trainer.torchrun_args must be a list of strings")
        return cls(launcher=launcher, nproc_per_node=nproc, torchrun_args=tuple(args), accelerate_config=acc,
                   env={str(k): str(v) for k, v in (d.get("env") or {}).items()}, k8s=k8s)


@dataclass(frozen=True)
class DeploymentSettings:
    executor: str = "in_process"              # in_process | multiprocess | k8s | celery
    executor_config: dict[str, Any] = field(default_factory=dict)  # the chosen executor's Dagster config
    trainer: TrainerDeployment = TrainerDeployment()

    @classmethod
    def from_dict(cls, d: dict | None, repo_root: Path) -> "DeploymentSettings":
        d = dict(d or {})
        _check("", d, {"executor", *EXECUTORS, "trainer"})
        executor = str(d.get("executor") or "in_process")
        if executor not in EXECUTORS:
            raise ValueError(f"pipeline recipe: deployment.executor must be one of {EXECUTORS}, got {executor!r}")
        cfg = dict(d.get(executor) or {})
        if executor == "k8s" and not cfg.get("job_image"):
            # without it the step pods reuse the run pod's image, which only exists under K8sRunLauncher
            cfg.setdefault("job_image", os.environ.get("DAGSTER_CURRENT_IMAGE") or None)
            cfg = {k: v for k, v in cfg.items() if v is not None}
        return cls(executor=executor, executor_config=cfg,
                   trainer=TrainerDeployment.from_dict(d.get("trainer"), repo_root))
