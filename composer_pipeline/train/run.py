"""Build and run the three-channel trainer (:class:`.trainer.ThreeChannelTrainer`): the entry points.

In:  a Store root with the pipeline's tables (:mod:`.data`), a :class:`~.config.TrainRecipe` (or its YAML
     path), optionally a model name/path and a step count, ``out_dir``.
Out: :func:`build_trainer` a :class:`Built` (the trainer and what finishing needs; ``plain_grpo``: TRL's own
     ``GRPOTrainer`` on the same config, data and rewards, the benchmark baseline); :func:`train` runs it and
     returns a :class:`TrainResult`: the checkpoint (:mod:`.checkpoints`), metrics, per-step losses
     (:mod:`.step_log`) and loss plots. The CLI (``composer-pipeline train``), Dagster Pipes
     (:mod:`.pipes_entry`), the experiment and ``bench/bench_train.py`` all call these.
"""

from __future__ import annotations

import copy
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl import GRPOTrainer

from composer_pipeline.train import distributed
from composer_pipeline.train import rewards as reward_mod
from composer_pipeline.train.checkpoints import write_checkpoint
from composer_pipeline.train.config import Channels, TrainRecipe, decide_channels, grpo_config
from composer_pipeline.train.data import (
    dpo_batches_from,
    dpo_pairs_in,
    grpo_records,
    interleave_error_sites,
    load_train_data,
)
from composer_pipeline.train.distributed import shard as shard_of
from composer_pipeline.train.modeling import load_policy, lora_config, resolve_model_path
from composer_pipeline.train.step_log import StepLog
from composer_pipeline.train.trainer import ThreeChannelTrainer
from composer_pipeline.workspace.verify import workspace_snapshots


# -- result ----------------------------------------------------------------------------------
@dataclass
class TrainResult:
    checkpoint: Path
    metrics: dict[str, Any]
    losses: list[dict[str, Any]]
    plots: dict[str, Path]


# -- entry point -------------------------------------------------------------------------------
@dataclass
class Built:
    """A ready-to-run trainer and what ``train`` needs to finish the job."""

    trainer: Any
    recipe: TrainRecipe
    tokenizer: Any
    data: Any
    channels: Channels
    model_path: str
    cuda: bool


def build_trainer(
    data_root: str,
    recipe: TrainRecipe | str | Path | None,
    *,
    model: str | None = None,
    steps: int | None = None,
    out_dir: Path,
    plain_grpo: bool = False,
    shard: tuple[int, int] | None = None,
    device: str | None = None,
) -> Built:
    """Load data and model and construct the trainer (``plain_grpo``: TRL's GRPOTrainer, same
    config, data and rewards, no extra channels: the benchmark baseline; ``shard``: ``(group, groups)``,
    train on that DiLoCo replica group's share of the prompts and pairs only; ``device``: None, the best
    device, else ``cpu`` / ``cuda`` / ``auto`` as :func:`~.modeling.load_policy` takes it)."""
    from datasets import Dataset

    recipe = recipe if isinstance(recipe, TrainRecipe) else TrainRecipe.load(recipe)
    recipe.validate()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    n_steps = int(steps if steps is not None else recipe.optim.steps)
    if n_steps < 1:
        raise ValueError("steps must be >= 1")
    model_path = resolve_model_path(model or recipe.model, out_dir)
    torch.manual_seed(recipe.optim.seed)

    data = load_train_data(
        data_root,
        heldout_fraction=recipe.data.heldout_fraction,
        hints=recipe.sdpo.hint,
        include_unpaired_states=recipe.data.include_unpaired_states,
        render_recipe=recipe.data.render_recipe,
    )
    if shard is not None:
        data.prompts, data.pairs = shard_of(data.prompts, *shard), shard_of(data.pairs, *shard)
    if not data.prompts:
        raise ValueError(f"no training prompts under {data_root} (after the held-out split): {data.summary()}")
    channels = decide_channels(
        recipe.weights, has_error_sites=any(p.hint for p in data.prompts), has_pairs=bool(data.pairs)
    )

    tok, policy = load_policy(model_path, device)
    cuda = policy.device.type == "cuda"
    if recipe.grpo.data_order == "shuffled":
        ordered = random.Random(recipe.optim.seed).sample(data.prompts, len(data.prompts))
    else:
        ordered = interleave_error_sites(data.prompts, recipe.grpo.prompts_per_step, recipe.optim.seed)
    records = grpo_records(tok, ordered, recipe.data.max_prompt_tokens, recipe.sdpo.hint.role, data.action_order)
    # the reward executes in each state's workspace
    if "workspace_executes" in recipe.grpo.rewards:
        snapshots = workspace_snapshots(data_root, [r["state_id"] for r in records])
        for r in records:
            r["workspace"] = snapshots.get(r["state_id"], "")
    ds = Dataset.from_list(records)
    dpo_batches = dpo_batches_from(tok, data.pairs, recipe) if channels.on("dpo") else []
    rank = distributed.current()
    # one model on N shards: every global batch below is split over the ranks
    if rank.distributed:
        distributed.per_rank_rows(recipe.dpo.batch_size, rank.world, "dpo.batch_size")
        dpo_batches = distributed.shard_dpo_batches(dpo_batches, rank.rank, rank.world)
    start_copy = None
    needs_start = (channels.on("dpo") and recipe.dpo.variant != "simpo") or (
        channels.on("sdpo") and recipe.sdpo.teacher == "initial"
    )
    if needs_start and not recipe.lora.enabled:
        start_copy = copy.deepcopy(policy).eval().requires_grad_(False)

    cfg = grpo_config(recipe, out_dir=out_dir, steps=n_steps, world=rank.world, cuda=cuda)
    common = dict(
        model=policy,
        reward_funcs=reward_mod.resolve(recipe.grpo.rewards),
        args=cfg,
        train_dataset=ds,
        processing_class=tok,
        peft_config=lora_config(recipe.lora),
    )
    if plain_grpo:
        trainer = GRPOTrainer(**common)
    else:
        trainer = ThreeChannelTrainer(
            **common,
            channels=channels,
            recipe=recipe,
            dpo_batches=dpo_batches,
            start_copy=start_copy,
        )

    # stdout carries only our JSON step lines
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return Built(trainer, recipe, tok, data, channels, model_path, cuda)


def data_reached(built: Built) -> dict[str, Any]:
    """The training data's summary, with ``pairs_reached``: the distinct pairs the DPO channel's steps
    read (fewer than ``pairs`` when the run is shorter than one pass over them)."""
    out = built.data.summary()
    trainer = built.trainer
    if isinstance(trainer, ThreeChannelTrainer) and trainer.dpo_batches:
        seen = trainer.dpo_batches_seen
        out["pairs_reached"] = dpo_pairs_in(len(built.data.pairs), built.recipe.dpo.batch_size, seen)
    return out


def train(
    data_root: str,
    recipe: TrainRecipe | str | Path | None,
    *,
    model: str | None = None,
    steps: int | None = None,
    out_dir: Path,
    on_step: Callable[[dict], None] | None = None,
    callbacks: list | None = None,
    shard: tuple[int, int] | None = None,
    device: str | None = None,
) -> TrainResult:
    """Run the three-channel trainer; returns the checkpoint, metrics, per-step losses and plots.
    ``callbacks``: extra ``transformers.TrainerCallback``s (e.g. a held-out probe every k steps);
    ``device``: as :func:`build_trainer` takes it."""
    out_dir = Path(out_dir)
    built = build_trainer(data_root, recipe, model=model, steps=steps, out_dir=out_dir, shard=shard, device=device)
    trainer, recipe, tok = built.trainer, built.recipe, built.tokenizer

    losses: list[dict[str, Any]] = []
    trainer.add_callback(StepLog(trainer, losses, on_step))
    for cb in callbacks or []:
        trainer.add_callback(cb)
    t_start = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t_start

    ckpt = out_dir / "checkpoint"
    rank = distributed.current()
    # rank 0 alone writes the checkpoint (all ranks hold the same weights)
    if not rank.main:
        distributed.barrier()
        return TrainResult(
            checkpoint=ckpt,
            metrics={"rank": rank.rank, "world_size": rank.world, "steps": len(losses)},
            losses=losses,
            plots={},
        )
    final = trainer.model
    if recipe.lora.enabled:
        final = trainer.accelerator.unwrap_model(final).merge_and_unload()
    metrics, plots = write_checkpoint(
        ckpt,
        final,
        tok,
        recipe,
        losses,
        off=built.channels.off_reasons,
        data_summary=data_reached(built),
        model_path=built.model_path,
        cuda=built.cuda,
        world_size=rank.world,
        train_seconds=train_s,
    )
    shutil.rmtree(out_dir / "trainer", ignore_errors=True)
    # the other ranks return once the checkpoint is complete
    distributed.barrier()
    return TrainResult(checkpoint=ckpt, metrics=metrics, losses=losses, plots=plots)
