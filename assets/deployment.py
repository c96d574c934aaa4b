"""The ``deployment`` section of ``recipes/pipeline.yaml``: where steps and the trainer run.

In: the ``deployment`` mapping (or nothing). Out: a frozen ``DeploymentSettings`` that
``assets/executors.py`` (Dagster executor) and ``resources/trainer.py`` (Pipes launcher) read.
Missing keys keep the single-machine defaults: ``executor: in_process``, ``trainer.launcher:
subprocess``. Simplified: the executor's own config (``k8s``/``celery``/``multiprocess``) is
passed to Dagster as written, so Dagster's schema validates it (a typo fails at load time);
only the names of the choices are checked here.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from composer_pipeline import settings
from composer_pipeline.settings import derived, setting
from resources.trainer import K8sTrainerPod

Executor = Literal["in_process", "multiprocess", "k8s", "celery"]
Launcher = Literal["subprocess", "torchrun", "accelerate", "k8s"]


@dataclass(frozen=True)
class TrainerDeployment:
    """How ``trained_policy`` starts the trainer (``resources/trainer.py``)."""

    launcher: Launcher = setting(
        "subprocess",
        help="subprocess (this machine) | torchrun / accelerate (data-parallel ranks here) | k8s (a trainer pod)",
    )
    nproc_per_node: int = setting(1, help="torchrun / accelerate processes on this machine")
    torchrun_args: tuple[str, ...] = setting((), help="multi-node rendezvous flags for torchrun; empty: --standalone")
    accelerate_config: str | None = setting(None, help="`accelerate launch --config_file` (relative to the repo root)")
    env: dict[str, str] = setting(factory=dict, help="extra environment of the trainer process")
    k8s: K8sTrainerPod = setting(factory=K8sTrainerPod, help="pod of the Pipes trainer (launcher: k8s)")

    def __post_init__(self) -> None:
        if self.launcher == "k8s" and not self.k8s.image:
            raise ValueError("launcher is k8s but k8s.image is not set")
        if self.nproc_per_node < 1:
            raise ValueError("nproc_per_node must be >= 1")

    def resolved(self, repo_root: Path) -> TrainerDeployment:
        """``accelerate_config`` as an absolute path (relative ones are relative to ``repo_root``)."""
        acc = self.accelerate_config
        if acc and "://" not in acc:
            p = Path(os.path.expanduser(acc))
            acc = str(p if p.is_absolute() else (repo_root / p).resolve())
        return dataclasses.replace(self, accelerate_config=acc)


@dataclass(frozen=True)
class DeploymentSettings:
    """The ``deployment:`` section of ``recipes/pipeline.yaml``."""

    executor: Executor = setting(
        "in_process", help="the Dagster executor of every run: in_process | multiprocess | k8s | celery"
    )
    in_process: dict[str, Any] = setting(factory=dict, help="in_process_executor config (passed to Dagster as written)")
    multiprocess: dict[str, Any] = setting(
        factory=dict, help="multiprocess_executor config (passed to Dagster as written)"
    )
    k8s: dict[str, Any] = setting(
        factory=dict, help="k8s_job_executor config (passed to Dagster as written; its schema checks it)"
    )
    celery: dict[str, Any] = setting(factory=dict, help="celery_executor config (passed to Dagster as written)")
    trainer: TrainerDeployment = setting(factory=TrainerDeployment, help="where and how the trainer runs")
    # the chosen executor's Dagster config (set by from_dict)
    executor_config: dict[str, Any] = derived(factory=dict)

    @classmethod
    def from_dict(cls, d: dict | None, repo_root: Path, where: str = "pipeline recipe") -> DeploymentSettings:
        return settings.from_dict(cls, d, where, "deployment").resolved(repo_root)

    def resolved(self, repo_root: Path) -> DeploymentSettings:
        """With ``executor_config`` (the chosen executor's section) and the trainer's paths made absolute."""
        cfg = dict(getattr(self, self.executor))
        if self.executor == "k8s" and not cfg.get("job_image"):
            # without it the step pods reuse the run pod's image, which only exists under K8sRunLauncher
            cfg.setdefault("job_image", os.environ.get("DAGSTER_CURRENT_IMAGE") or None)
            cfg = {k: v for k, v in cfg.items() if v is not None}
        return dataclasses.replace(self, executor_config=cfg, trainer=self.trainer.resolved(repo_root))
