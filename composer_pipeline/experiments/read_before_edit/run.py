"""The read-before-edit experiment's run: the base model, each seed's start policy, and every arm × seed cell.

In:  an :class:`~.config.ExperimentConfig`.
Out: under ``cfg.out``: ``run.json`` (the settings a cell depends on), ``data/`` (:mod:`.data`), ``base/``
     (``--model tiny``: the base model trained here), per seed its start policy and each arm's checkpoint,
     and each cell in ``cells/`` when it is done (row, curve, per-state outputs); then :func:`.report.collect`.

Resumable: a re-run with the same settings skips finished cells (another process on the same directory
may run other seeds: each cell is re-checked before it is run); ``budget_minutes`` stops between cells;
other settings in the same directory are refused, naming them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from composer_pipeline.experiments.pretrain import pretrain_base
from composer_pipeline.experiments.read_before_edit.arms import (
    ARMS,
    arm_recipe,
    consensus_store,
    render_recipe,
    shuffled_label_store,
)
from composer_pipeline.experiments.read_before_edit.config import REPO, ExperimentConfig
from composer_pipeline.experiments.read_before_edit.data import build_data
from composer_pipeline.experiments.read_before_edit.probe import heldout_cases, probe, probe_callback
from composer_pipeline.experiments.read_before_edit.report import collect
from composer_pipeline.experiments.sft import supervise_on_agent_actions
from composer_pipeline.train.config import TrainRecipe
from composer_pipeline.train.modeling import load_policy, resolve_device, resolve_model_path


def _check_run_dir(out: Path, cfg: ExperimentConfig) -> None:
    """A re-run may resume an out dir only with the same settings (other seeds / arms are fine)."""
    run = out / "run.json"
    fp = json.loads(json.dumps(cfg.fingerprint(), default=str))
    if run.is_file():
        old = json.loads(run.read_text())
        diff = sorted(k for k in set(old) | set(fp) if old.get(k) != fp.get(k))
        if diff:
            raise ValueError(
                f"{out} holds cells of a run with other settings ({', '.join(diff)}): "
                f"use another --out, or delete {out} to start over"
            )
    else:
        run.write_text(json.dumps(fp, indent=1))


def _cell_path(out: Path, seed: int, arm: str) -> Path:
    return out / "cells" / f"seed{seed}-{arm}.json"


def _finished_start_probe(out: Path, seed: int) -> dict[str, Any] | None:
    """The start policy's probe as its finished ``start`` cell recorded it (metrics and outputs), if any."""
    cell = _cell_path(out, seed, "start")
    if not cell.is_file():
        return None
    done = json.loads(cell.read_text())
    cell_keys = ("arm", "seed", "steps", "seconds")
    return {**{k: v for k, v in done["row"].items() if k not in cell_keys}, "outputs": done["outputs"]}


def run_experiment(cfg: ExperimentConfig, emit: Callable[[str], object] = print) -> dict[str, Any]:
    """Every arm × seed cell is written to ``cells/`` when done; a re-run with the same settings skips
    finished cells; with ``budget_minutes`` it stops before a cell once the budget is spent."""
    from composer_pipeline.train.data import load_train_data

    _check_config(cfg)
    # fails here when cuda is asked for and absent
    cfg = replace(cfg, device=resolve_device(cfg.device))
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    _check_run_dir(out, cfg)
    t0 = time.perf_counter()
    over_budget = lambda: cfg.budget_minutes is not None and time.perf_counter() - t0 > 60 * cfg.budget_minutes  # noqa: E731
    data_info = build_data(out / "data", cfg)
    emit(json.dumps({"data": data_info}))
    base = TrainRecipe.load(REPO / "recipes" / "train.yaml")
    train_rows = load_train_data(
        data_info["train_store"], heldout_fraction=0.0, hints=base.sdpo.hint, render_recipe=render_recipe(cfg)
    ).prompts
    base_model = _base_model(cfg, out, base, emit)
    stopped = None
    for seed in cfg.only_seeds if cfg.only_seeds is not None else range(cfg.seeds):
        todo = [arm for arm in cfg.arms if not _cell_path(out, seed, arm).is_file()]
        for arm in cfg.arms:
            if arm not in todo:
                emit(json.dumps({**json.loads(_cell_path(out, seed, arm).read_text())["row"], "resumed": True}))
        if not todo:
            continue
        if over_budget():
            stopped = {"stopped": "budget", "budget_minutes": cfg.budget_minutes, "before": f"seed {seed}"}
            break
        ts = time.perf_counter()
        start = out / f"seed{seed}" / "start"
        if not (start / "config.json").is_file():
            supervise_on_agent_actions(
                base_model,
                train_rows,
                start,
                steps=cfg.sft_steps,
                seed=seed,
                lr=cfg.sft_lr,
                max_prompt_tokens=cfg.prompt_tokens,
                max_completion_tokens=cfg.max_new_tokens,
                device=cfg.device,
                action_order=cfg.action_order,
            )
        tok, start_model = load_policy(str(start), cfg.device)
        cases = heldout_cases(data_info["heldout_store"], tok, cfg.prompt_tokens, cfg.probe_states)
        # greedy: probing the same weights again gives the same
        start_metrics = _finished_start_probe(out, seed)
        if start_metrics is None:
            start_metrics = probe(start_model, tok, cases, max_new_tokens=cfg.max_new_tokens)
        del start_model
        sft_s = time.perf_counter() - ts
        for arm in todo:
            # finished meanwhile by another process (--only-seeds)
            if _cell_path(out, seed, arm).is_file():
                continue
            if arm != todo[0] and over_budget():
                stopped = {"stopped": "budget", "budget_minutes": cfg.budget_minutes, "before": f"seed {seed} {arm}"}
                break
            ta = time.perf_counter()
            curve = [{"step": 0, **{k: v for k, v in start_metrics.items() if k != "outputs"}}]
            if ARMS[arm] is None:
                metrics, steps = start_metrics, 0
            else:
                metrics, steps = _train_arm(arm, cfg, base, start, seed, data_info, (tok, cases, curve))
            row = {
                "arm": arm,
                "seed": seed,
                **{k: v for k, v in metrics.items() if k != "outputs"},
                "steps": steps,
                "seconds": round(time.perf_counter() - ta + (sft_s if arm == "start" else 0.0), 1),
            }
            _write_cell(_cell_path(out, seed, arm), {"row": row, "curve": curve, "outputs": metrics["outputs"]})
            emit(json.dumps(row))
        if stopped:
            break
    if stopped:
        emit(json.dumps(stopped))
    return {
        **collect(out, cfg),
        "seconds": time.perf_counter() - t0,
        "data": data_info,
        "out": str(out),
        "stopped": stopped,
    }


def _check_config(cfg: ExperimentConfig) -> None:
    """The experiment's cross-setting rules: known arms, an NLL weight for the NLL arms, a known probe set."""
    unknown = set(cfg.arms) - set(ARMS)
    if unknown:
        raise ValueError(f"unknown arms {sorted(unknown)}; known: {list(ARMS)}")
    if {"nll", "nll_all"} & set(cfg.arms) and not cfg.dpo_sft_weight > 0:
        raise ValueError("the nll and nll_all arms are the NLL term alone: they need --dpo-sft-weight > 0")
    if cfg.probe_states not in ("all", "decisive"):
        raise ValueError(f"probe_states must be all or decisive, got {cfg.probe_states!r}")


def _base_model(cfg: ExperimentConfig, out: Path, base: TrainRecipe, emit: Callable[[str], object]) -> str:
    """The model every seed's start is supervised from: ``cfg.model``, or for ``tiny`` one pretrained here."""

    if cfg.model != "tiny":
        return resolve_model_path(cfg.model)
    # trained from scratch on other generated sessions first (every file pair, no held-out request)

    base_model = str(
        pretrain_base(
            out / "base",
            sessions=cfg.pretrain_sessions,
            steps=cfg.pretrain_steps,
            max_tokens=cfg.prompt_tokens,
            hint_templates=base.sdpo.hint,
            device=cfg.device,
            action_order=cfg.action_order,
        )
    )
    meta = json.loads((out / "base" / "pretrain.json").read_text())
    emit(
        json.dumps(
            {
                "base": {
                    **meta["settings"],
                    "windows": meta["windows"],
                    "seconds": meta["seconds"],
                    "final_loss": meta["curve"][-1]["loss"],
                }
            }
        )
    )
    return base_model


def _train_arm(
    arm: str, cfg: ExperimentConfig, base: TrainRecipe, start: Path, seed: int, data_info: dict, probing: tuple
) -> tuple[dict[str, Any], int]:
    """Train one arm from the seed's start on the data it reads and probe the result: ``(metrics, steps)``.
    ``probing``: (tokenizer, held-out cases, the curve the probe callback appends to)."""
    from composer_pipeline.train.run import train

    tok, cases, curve = probing
    out = Path(cfg.out)
    spec = ARMS[arm]
    if spec is None:
        raise ValueError(f"the {arm} arm trains nothing")
    recipe = arm_recipe(base, arm, cfg, start, seed)
    if spec.data == "consensus_all":
        root = consensus_store(
            data_info["train_store"], out / f"seed{seed}" / "consensus_store", seed, cfg.action_order
        )
    elif spec.data == "shuffled_labels":
        root = shuffled_label_store(data_info["train_store"], out / f"seed{seed}" / "shuffled_label_store", seed)
    else:
        root = data_info["error_site_store" if spec.data == "error_sites" else "train_store"]
    res = train(
        root,
        recipe,
        out_dir=out / f"seed{seed}" / arm,
        callbacks=[probe_callback(tok, cases, cfg.eval_every, curve, cfg.max_new_tokens)],
        device=cfg.device,
    )
    tok2, final = load_policy(str(res.checkpoint), cfg.device)
    metrics = probe(final, tok2, cases, max_new_tokens=cfg.max_new_tokens)
    del final
    if curve[-1]["step"] != cfg.steps:
        curve.append({"step": cfg.steps, **{k: v for k, v in metrics.items() if k != "outputs"}})
    steps = len(res.losses)
    return metrics, steps


def _write_cell(path: Path, cell: dict) -> None:
    """The cell: its row, its curve and its per-state outputs, written at once when it is done."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cell))
    tmp.replace(path)
