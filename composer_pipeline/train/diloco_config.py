"""The recipe's ``diloco:`` section: training across replica groups that sync every H steps (DiLoCo).

In:  the ``diloco`` mapping of ``recipes/train.yaml`` (read through :mod:`composer_pipeline.settings`).
Out: :class:`DiLoCoSection` (``replica_groups: 1`` = off, the plain one-process / DDP trainer) and
     :func:`shard`, the one rule that gives each group its own slice of the training data.

Sign convention (DiLoCo, Douillard et al. 2023, arXiv:2311.08455, Algorithm 1): every ``inner_steps``
(H) optimizer steps each live group computes its *pseudo-gradient* ``Δ_g = θ_before − θ_after`` (the
global parameters at the last sync minus this group's parameters after its H inner steps: it points
where a gradient points, uphill); the groups' mean ``Δ = mean_g Δ_g`` over the groups live in that
outer step is fed to the outer optimizer as the gradient of ``θ_before``: with Nesterov SGD
``b ← μ·b + Δ``, ``θ ← θ_before − lr·(Δ + μ·b)``. With ``outer_lr: 1`` and no momentum the outer
step is ``θ_before − Δ``: the mean of the groups' parameters (model averaging).

Deliberately simplified: one fragment (the whole model syncs at once, no Streaming DiLoCo); the
pseudo-gradients travel at full precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from composer_pipeline.settings import setting

T = TypeVar("T")


@dataclass
class DiLoCoSection:
    replica_groups: int = setting(
        1, help="replica groups training one model (DiLoCo through torchft); 1 = off (one process or DDP ranks)"
    )
    inner_steps: int = setting(
        5, help="H: optimizer steps each group takes on its own shard between two syncs (the paper uses 500)"
    )
    outer_lr: float = setting(0.7, help="outer optimizer learning rate (DiLoCo paper, arXiv:2311.08455: 0.7)")
    outer_momentum: float = setting(0.9, help="outer SGD momentum μ (paper: 0.9); 0 = plain SGD")
    nesterov: bool = setting(True, help="Nesterov momentum in the outer SGD (paper: true)")
    lighthouse: str | None = setting(
        None,
        help="many hosts: the torchft lighthouse address (http://HOST:PORT) this host's group joins; "
        "null = `composer-pipeline train` starts one lighthouse and every group on this machine",
    )
    group: int | None = setting(
        None, help="many hosts: this host's group id, 0 .. replica_groups-1 (`train --group` overrides)"
    )
    rejoin_timeout_s: float = setting(
        120.0,
        help="a lost group restarted by the launching command must rejoin within this many seconds, else it is "
        "dropped (logged with the reason) and the others go on; also how long a sync waits for a heartbeating straggler",
    )
    max_restarts: int = setting(2, help="restarts per group before it is dropped (one machine)")
    timeout_s: float = setting(
        30.0, help="torchft timeout of one collective / commit: how long a sync waits on a peer that stopped answering"
    )

    def __post_init__(self) -> None:
        if self.replica_groups < 1:
            raise ValueError(f"diloco.replica_groups must be >= 1, got {self.replica_groups}")
        if self.inner_steps < 1:
            raise ValueError(f"diloco.inner_steps must be >= 1, got {self.inner_steps}")
        if self.outer_lr <= 0 or not 0 <= self.outer_momentum < 1:
            raise ValueError("diloco.outer_lr must be > 0 and diloco.outer_momentum in [0, 1)")
        if self.nesterov and self.outer_momentum == 0:
            raise ValueError("diloco.nesterov needs diloco.outer_momentum > 0 (torch's SGD refuses it)")
        if self.group is not None and not 0 <= self.group < self.replica_groups:
            raise ValueError(f"diloco.group must be in 0..{self.replica_groups - 1}, got {self.group}")

    @property
    def enabled(self) -> bool:
        return self.replica_groups > 1

    def outer_steps(self, steps: int) -> int:
        """Outer steps in a run of ``steps`` inner steps per group (``steps`` must be a multiple of H)."""
        if steps % self.inner_steps:
            raise ValueError(
                f"optim.steps = {steps} is not a multiple of diloco.inner_steps = {self.inner_steps}: "
                "every group must end on a sync"
            )
        return steps // self.inner_steps


def shard(items: list[T], group: int, groups: int) -> list[T]:
    """Group ``group``'s share of ``items``: every ``groups``-th item from its index (disjoint, covering)."""
    return items[group::groups]
