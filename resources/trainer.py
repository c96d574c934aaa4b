"""Trainer launcher: runs ``composer_pipeline.train.pipes_entry`` through Dagster Pipes.

In: data root (a Store root), train recipe, base model, steps, output dir. Out: the Pipes
session's materialize result (progress logs, per-channel losses and final metrics reported by
the subprocess). The command is a plain ``[python, -m, module]`` so the same asset can later
launch ``torchrun``/``accelerate`` (``command_prefix``) or swap in ``PipesK8sClient``.
Simplified: one local subprocess, CPU by default, no retries.

Launchers (``deployment.trainer`` in ``recipes/pipeline.yaml``, see docs/SCALING.md):
``subprocess`` (default), ``torchrun`` / ``accelerate`` (the same Pipes subprocess behind a
``torchrun --nproc-per-node N -m`` / ``accelerate launch --config_file F -m`` prefix) and ``k8s``
(``dagster_k8s.PipesK8sClient``: a pod with the configured image, GPU request, secrets and volumes,
running python/torchrun/accelerate inside). With N ranks the trainer is data-parallel
(``composer_pipeline.train.distributed``): one model on N shards, rank 0 alone reports through Pipes
and writes the checkpoint. Local torchrun uses ``--standalone`` (a free rendezvous port) unless
``torchrun_args`` names a multi-node rendezvous (docs/SCALING.md).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional

import dagster as dg

ENTRY_MODULE = "composer_pipeline.train.pipes_entry"


def torchrun_command(nproc_per_node: int, python: str | None = None, extra: list[str] | None = None) -> list[str]:
    """``torchrun [extra] --nproc-per-node N -m <entry>``; with ``python``: ``python -m torch.distributed.run``
    (same CLI). ``extra``: e.g. ``["--standalone"]`` or a multi-node rendezvous
    (``--nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=host:29400 --rdzv-id=job``)."""
    head = [python, "-m", "torch.distributed.run"] if python else ["torchrun"]
    return [*head, *(extra or []), f"--nproc-per-node={int(nproc_per_node)}", "-m", ENTRY_MODULE]


def accelerate_command(config_file: str | None, nproc_per_node: int = 1, python: str | None = None) -> list[str]:
    """``accelerate launch [--config_file F] [--num_processes N] -m <entry>``."""
    exe = None
    if python:
        exe = Path(python).parent / "accelerate"
    head = [str(exe), "launch"] if exe is not None and exe.exists() else ["accelerate", "launch"]
    if config_file:
        head += ["--config_file", str(config_file)]
    if nproc_per_node > 1 or not config_file:
        head += ["--num_processes", str(int(nproc_per_node))]
    return [*head, "-m", ENTRY_MODULE]


class TrainerLauncher(dg.ConfigurableResource):
    """How to start the trainer process. ``command_prefix`` e.g. ``["torchrun", "--nproc_per_node=2"]``."""

    command_prefix: list[str] = []
    env: dict[str, str] = {}
    # deployment.trainer (assets/deployment.py): subprocess | torchrun | accelerate | k8s
    launcher: str = "subprocess"
    nproc_per_node: int = 1
    torchrun_args: list[str] = []  # multi-node rendezvous flags; empty: --standalone (one machine)
    accelerate_config: Optional[str] = None
    k8s: dict[str, Any] = {}

    def command(self) -> list[str]:
        if self.command_prefix:
            return [*self.command_prefix, "-m", "composer_pipeline.train.pipes_entry"]
        if self.launcher == "torchrun":
            return torchrun_command(self.nproc_per_node, python=sys.executable, extra=list(self.torchrun_args) or ["--standalone"])
        if self.launcher == "accelerate":
            return accelerate_command(self.accelerate_config, self.nproc_per_node, python=sys.executable)
        return [sys.executable, "-m", "composer_pipeline.train.pipes_entry"]

    def run(self, context, *, extras: dict, pipes_client: dg.PipesSubprocessClient):
        env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **self.env}
        if self.launcher == "k8s":  # the trainer in its own pod; pipes_client (local) is not used
            k = self.k8s
            return self.pipes_k8s_client().run(
                context=context, extras=extras, image=k["image"], command=self.k8s_command(),
                namespace=k.get("namespace") or "default", env={**env, **(k.get("env") or {})},
                base_pod_spec=self.k8s_pod_spec(),
            )
        return pipes_client.run(command=self.command(), context=context, extras=extras, env=env)

    # --- launcher: k8s -------------------------------------------------------------------------
    def k8s_command(self) -> list[str]:
        """What the trainer pod runs: ``python -m <entry>``, or torchrun / accelerate inside the pod."""
        k = self.k8s
        inner = k.get("command") or "python"
        nproc = int(k.get("nproc_per_node") or k.get("gpus") or 1)
        if inner == "torchrun":
            return torchrun_command(nproc)
        if inner == "accelerate":
            return accelerate_command(k.get("accelerate_config"), nproc)
        return ["python", "-m", ENTRY_MODULE]

    def k8s_pod_spec(self) -> dict[str, Any]:
        """``base_pod_spec`` for ``PipesK8sClient``: resources (+ ``nvidia.com/gpu``), secrets, volumes."""
        k = self.k8s
        resources = {kind: dict(v) for kind, v in (k.get("resources") or {}).items()}
        gpus = int(k.get("gpus") or 0)
        if gpus:
            for kind in ("requests", "limits"):  # GPUs: requests must equal limits
                resources.setdefault(kind, {})["nvidia.com/gpu"] = str(gpus)
        container: dict[str, Any] = {"name": "trainer", "image": k["image"]}
        if resources:
            container["resources"] = resources
        if k.get("image_pull_policy"):
            container["imagePullPolicy"] = k["image_pull_policy"]
        if k.get("env_secrets"):
            container["envFrom"] = [{"secretRef": {"name": name}} for name in k["env_secrets"]]
        if k.get("volume_mounts"):
            container["volumeMounts"] = list(k["volume_mounts"])
        spec: dict[str, Any] = {"containers": [container], "restartPolicy": "Never"}
        for key, field in (("volumes", "volumes"), ("node_selector", "nodeSelector"),
                           ("tolerations", "tolerations"), ("service_account_name", "serviceAccountName")):
            if k.get(key):
                spec[field] = k[key]
        return spec

    def pipes_k8s_client(self):
        from dagster_k8s import PipesK8sClient

        k = self.k8s
        return PipesK8sClient(
            load_incluster_config=k.get("load_incluster_config"),
            kubeconfig_file=k.get("kubeconfig_file"),
            poll_interval=float(k.get("poll_interval_s") or 10.0),
        )

    @classmethod
    def from_deployment(cls, trainer) -> "TrainerLauncher":
        """From ``PipelineSettings.deployment.trainer`` (``assets.deployment.TrainerDeployment``)."""
        return cls(launcher=trainer.launcher, nproc_per_node=trainer.nproc_per_node, torchrun_args=list(trainer.torchrun_args),
                   accelerate_config=trainer.accelerate_config, env=dict(trainer.env), k8s=dict(trainer.k8s))
