"""One DiLoCo replica group: the three-channel trainer's inner steps on its shard, torchft's outer step.

In:  a Store root, a :class:`~.config.TrainRecipe` whose ``diloco`` section has ``replica_groups`` ≥ 2,
     this group's id, the torchft lighthouse address, ``out_dir``.
Out: :func:`train_group` runs :func:`.run.train` on the group's shard (:func:`.distributed.shard`) with
     torchft's ``DiLoCo`` wrapped around the trainer's optimizer (:class:`OuterSteps`), and returns its
     :class:`~.run.TrainResult` (the checkpoint under ``out_dir/checkpoint``); every step line gains
     ``group``, ``outer_step`` (torchft's committed syncs so far), ``replica_groups_live`` (groups in the
     last sync) and ``allreduce_bytes`` (pseudo-gradient bytes this group has sent so far).
     ``python -m composer_pipeline.train.diloco_group`` is the process :mod:`.diloco_launch` starts per group.

The engine is torchft's (``torchft.local_sgd.DiLoCo``, ``Manager``, ``ProcessGroupGloo`` on CPU / NCCL on
CUDA): every H inner optimizer steps its post-step hook asks the lighthouse for a quorum of the live
groups, all-reduces the pseudo-gradients ``θ_before − θ_after`` (mean over the quorum) and steps the
outer optimizer (:func:`outer_optimizer`, sign convention in :class:`.config.DiLoCoSection`). A group that comes
back after a crash is behind: the quorum tells it to heal, and it receives a live peer's state
(parameters, inner and outer optimizer state, the global parameters, the outer step) over torchft's
checkpoint transport before that sync, then goes on with the others.

Deliberately simplified: one process per group (no DDP inside a group); the run length is counted in
outer steps (``optim.steps / H``): a sync whose commit fails is retried with H more inner steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torchft import Manager
from torchft.local_sgd import DiLoCo
from transformers import TrainerCallback

from composer_pipeline.train.config import DiLoCoSection, TrainRecipe
from composer_pipeline.train.diloco_manager import CountingManager, make_manager
from composer_pipeline.train.run import train


def outer_optimizer(params, d: DiLoCoSection) -> torch.optim.Optimizer:
    """The outer optimizer: SGD with (Nesterov) momentum on the averaged pseudo-gradient
    (DiLoCo, arXiv:2311.08455: lr 0.7, momentum 0.9, Nesterov)."""
    return torch.optim.SGD(params, lr=d.outer_lr, momentum=d.outer_momentum, nesterov=d.nesterov)


def wrap(manager: Manager, model: torch.nn.Module, inner: torch.optim.Optimizer, d: DiLoCoSection) -> DiLoCo:
    """torchft's DiLoCo around ``inner`` (enter it to install the hooks); registers what a healing
    group receives from a live peer: the parameters and the inner optimizer's state (DiLoCo adds the
    global parameters and the outer optimizer's state)."""

    def state() -> dict[str, Any]:
        return {"model": model.state_dict(), "inner": inner.state_dict()}

    def load(sd: dict[str, Any]) -> None:
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["inner"])

    manager.register_state_dict_fn("default", load, state)
    return DiLoCo(
        manager,
        [model],
        inner,
        outer_optimizer(model.parameters(), d),
        sync_every=d.inner_steps,
        pin_memory=False,
    )


class OuterSteps(TrainerCallback):
    """Installs torchft's DiLoCo on the trainer's optimizer when training begins, stops the trainer once
    ``target`` outer steps are committed, and says what each step line gains (:meth:`fields`).

    ``must_heal``: this group was restarted, so its first committed sync must have healed it from a
    live peer (torchft's step jumps past 1); a group that found no peer to heal from stops with an error
    rather than train alone from its stale weights."""

    def __init__(self, manager: CountingManager, d: DiLoCoSection, group: int, target: int, must_heal: bool):
        self.manager, self.d, self.group, self.target, self.must_heal = manager, d, group, target, must_heal
        self.diloco: DiLoCo | None = None
        self.seen_step = 0
        self.healed_at: int | None = None

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kw):
        # accelerate's wrapper -> the torch optimizer
        inner = getattr(optimizer, "optimizer", optimizer)
        self.diloco = wrap(self.manager, model, inner, self.d).__enter__()

    def on_step_end(self, args, state, control, **kw):
        step = self.manager.current_step()
        # the quorum moved this group forward: it healed from a peer
        if step > self.seen_step + 1:
            self.healed_at = self.seen_step if self.healed_at is None else self.healed_at
        elif self.must_heal and step == 1 and self.seen_step == 0:
            raise RuntimeError(f"group {self.group} was restarted but found no live peer to heal from")
        self.seen_step = step
        if step >= self.target:
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kw):
        if self.diloco is not None:
            self.diloco.__exit__(None, None, None)

    def fields(self) -> dict[str, Any]:
        step = self.manager.current_step()
        return {
            "group": self.group,
            "outer_step": step,
            "replica_groups_live": self.manager.num_participants() if step else None,
            "allreduce_bytes": self.manager.allreduce_bytes,
            "healed": self.healed_at is not None,
        }


@dataclass
class GroupRun:
    result: Any
    outer_steps: int
    healed: bool
    allreduce_bytes: int


def train_group(
    data_root: str,
    recipe: TrainRecipe | str | Path | None,
    *,
    group: int,
    lighthouse: str,
    out_dir: Path,
    model: str | None = None,
    steps: int | None = None,
    on_step: Callable[[dict], None] | None = None,
    must_heal: bool = False,
    host: str | None = None,
    manager: CountingManager | None = None,
) -> GroupRun:
    """Train group ``group`` of ``recipe.diloco.replica_groups`` until ``steps / H`` outer steps are
    committed (at most twice ``steps`` inner steps, should syncs fail and be retried). ``manager``: one
    already heartbeating to ``lighthouse`` (:mod:`.diloco_group` starts it before the heavy imports)."""
    recipe = recipe if isinstance(recipe, TrainRecipe) else TrainRecipe.load(recipe)
    d = recipe.diloco
    n_steps = int(steps if steps is not None else recipe.optim.steps)
    target = d.outer_steps(n_steps)
    manager = manager or make_manager(group, lighthouse, d, host=host)
    outer = OuterSteps(manager, d, group, target, must_heal)

    def step_line(rec: dict) -> None:
        rec.update(outer.fields())
        if on_step is not None:
            on_step(rec)

    try:
        res = train(
            data_root,
            recipe,
            model=model,
            steps=2 * n_steps,
            out_dir=Path(out_dir),
            on_step=step_line,
            callbacks=[outer],
            shard=(group, d.replica_groups),
        )
    finally:
        manager.shutdown(wait=False)
    done = manager.current_step()
    if done < target:
        raise RuntimeError(f"group {group} committed {done} of {target} outer steps in {2 * n_steps} inner steps")
    res.metrics["diloco"] = {
        "replica_groups": d.replica_groups,
        "group": group,
        "outer_steps": done,
        "healed": outer.healed_at is not None,
    }
    return GroupRun(res, done, outer.healed_at is not None, manager.allreduce_bytes)
