"""Trainer launcher: runs ``composer_pipeline.train.pipes_entry`` through Dagster Pipes.

In: data root (a Store root), train recipe, base model, steps, output dir. Out: the Pipes
session's materialize result (progress logs, per-channel losses and final metrics reported by
the subprocess). The command is a plain ``[python, -m, module]`` so the same asset can later
launch ``torchrun``/``accelerate`` (``command_prefix``) or swap in ``PipesK8sClient``.
Simplified: one local subprocess, CPU by default, no retries.
"""

from __future__ import annotations

import os
import sys

import dagster as dg


class TrainerLauncher(dg.ConfigurableResource):
    """How to start the trainer process. ``command_prefix`` e.g. ``["torchrun", "--nproc_per_node=2"]``."""

    command_prefix: list[str] = []
    env: dict[str, str] = {}

    def command(self) -> list[str]:
        if self.command_prefix:
            return [*self.command_prefix, "-m", "composer_pipeline.train.pipes_entry"]
        return [sys.executable, "-m", "composer_pipeline.train.pipes_entry"]

    def run(self, context, *, extras: dict, pipes_client: dg.PipesSubprocessClient):
        env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **self.env}
        return pipes_client.run(command=self.command(), context=context, extras=extras, env=env)
