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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import dagster as dg

from composer_pipeline import settings
from composer_pipeline.settings import setting

ENTRY_MODULE = "composer_pipeline.train.pipes_entry"


@dataclass(frozen=True)
class K8sTrainerPod:
    """The trainer pod (``deployment.trainer.k8s`` of recipes/pipeline.yaml, launcher ``k8s``): what
    ``PipesK8sClient`` starts. Declared once, here; the settings layer reads it from the recipe and the
    launcher reads it back from its Dagster config (:meth:`TrainerLauncher.pod`)."""

    image: str | None = setting(None, help="the pod's image (required with launcher: k8s)")
    namespace: str = setting("default", help="Kubernetes namespace of the pod")
    command: Literal["python", "torchrun", "accelerate"] = setting(
        "python", help="what the pod runs: python | torchrun | accelerate"
    )
    nproc_per_node: int | None = setting(None, help="ranks in the pod (torchrun / accelerate); null: gpus, else 1")
    accelerate_config: str | None = setting(None, help="`accelerate launch --config_file` inside the pod")
    gpus: int = setting(0, help="nvidia.com/gpu request (= limit); 0: a CPU pod")
    resources: dict[str, dict[str, str]] = setting(factory=dict, help="container resources: requests / limits")
    env: dict[str, str] = setting(factory=dict, help="extra environment of the trainer container")
    env_secrets: tuple[str, ...] = setting((), help="Secrets given to the container as environment (envFrom)")
    node_selector: dict[str, str] = setting(factory=dict, help="the pod's nodeSelector")
    tolerations: tuple[dict[str, Any], ...] = setting((), help="the pod's tolerations")
    volumes: tuple[dict[str, Any], ...] = setting((), help="the pod's volumes")
    volume_mounts: tuple[dict[str, Any], ...] = setting((), help="the container's volumeMounts")
    service_account_name: str | None = setting(None, help="the pod's serviceAccountName")
    image_pull_policy: str | None = setting(None, help="the container's imagePullPolicy")
    load_incluster_config: bool | None = setting(
        None, help="PipesK8sClient: in-cluster config (null: its own detection)"
    )
    kubeconfig_file: str | None = setting(None, help="PipesK8sClient: kubeconfig file outside the cluster")
    poll_interval_s: float = setting(10.0, help="PipesK8sClient: seconds between polls of the pod")


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
    # multi-node rendezvous flags; empty: --standalone (one machine)
    torchrun_args: list[str] = []
    accelerate_config: str | None = None
    # a K8sTrainerPod as plain data (Dagster config); read it through .pod
    k8s: dict[str, Any] = {}

    @property
    def pod(self) -> K8sTrainerPod:
        """``k8s`` as the typed pod settings (unknown keys and wrong types are an error naming the key)."""
        return settings.from_dict(K8sTrainerPod, self.k8s, "TrainerLauncher", "k8s")

    def command(self) -> list[str]:
        if self.command_prefix:
            return [*self.command_prefix, "-m", "composer_pipeline.train.pipes_entry"]
        if self.launcher == "torchrun":
            return torchrun_command(
                self.nproc_per_node, python=sys.executable, extra=list(self.torchrun_args) or ["--standalone"]
            )
        if self.launcher == "accelerate":
            return accelerate_command(self.accelerate_config, self.nproc_per_node, python=sys.executable)
        return [sys.executable, "-m", "composer_pipeline.train.pipes_entry"]

    def run(self, context, *, extras: dict, pipes_client: dg.PipesSubprocessClient):
        env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **self.env}
        # the trainer in its own pod; pipes_client (local) is not used
        if self.launcher == "k8s":
            pod = self.pod
            return self.pipes_k8s_client().run(
                context=context,
                extras=extras,
                image=pod.image,
                command=self.k8s_command(),
                namespace=pod.namespace,
                env={**env, **pod.env},
                base_pod_spec=self.k8s_pod_spec(),
            )
        return pipes_client.run(command=self.command(), context=context, extras=extras, env=env)

    # --- launcher: k8s -------------------------------------------------------------------------
    def k8s_command(self) -> list[str]:
        """What the trainer pod runs: ``python -m <entry>``, or torchrun / accelerate inside the pod."""
        pod = self.pod
        nproc = pod.nproc_per_node or pod.gpus or 1
        if pod.command == "torchrun":
            return torchrun_command(nproc)
        if pod.command == "accelerate":
            return accelerate_command(pod.accelerate_config, nproc)
        return ["python", "-m", ENTRY_MODULE]

    def k8s_pod_spec(self) -> dict[str, Any]:
        """``base_pod_spec`` for ``PipesK8sClient``: resources (+ ``nvidia.com/gpu``), secrets, volumes."""
        pod = self.pod
        resources = {kind: dict(v) for kind, v in pod.resources.items()}
        if pod.gpus:
            for kind in ("requests", "limits"):  # GPUs: requests must equal limits
                resources.setdefault(kind, {})["nvidia.com/gpu"] = str(pod.gpus)
        container: dict[str, Any] = {"name": "trainer", "image": pod.image}
        if resources:
            container["resources"] = resources
        if pod.image_pull_policy:
            container["imagePullPolicy"] = pod.image_pull_policy
        if pod.env_secrets:
            container["envFrom"] = [{"secretRef": {"name": name}} for name in pod.env_secrets]
        if pod.volume_mounts:
            container["volumeMounts"] = list(pod.volume_mounts)
        spec: dict[str, Any] = {"containers": [container], "restartPolicy": "Never"}
        for field, value in (
            ("volumes", list(pod.volumes)),
            ("nodeSelector", pod.node_selector),
            ("tolerations", list(pod.tolerations)),
            ("serviceAccountName", pod.service_account_name),
        ):
            if value:
                spec[field] = value
        return spec

    def pipes_k8s_client(self):
        from dagster_k8s import PipesK8sClient

        pod = self.pod
        return PipesK8sClient(
            load_incluster_config=pod.load_incluster_config,
            kubeconfig_file=pod.kubeconfig_file,
            poll_interval=pod.poll_interval_s,
        )

    @classmethod
    def from_deployment(cls, trainer) -> TrainerLauncher:
        """From ``PipelineSettings.deployment.trainer`` (``assets.deployment.TrainerDeployment``)."""
        pod = {k: v for k, v in settings.to_dict(trainer.k8s).items() if v is not None}  # Dagster config takes no nulls
        return cls(
            launcher=trainer.launcher,
            nproc_per_node=trainer.nproc_per_node,
            torchrun_args=list(trainer.torchrun_args),
            accelerate_config=trainer.accelerate_config,
            env=dict(trainer.env),
            k8s=pod,
        )
