"""The trainer's per-step log: one JSON-able line per optimizer step, as a ``transformers.TrainerCallback``.

In:  the micro-batch records ``ThreeChannelTrainer._compute_loss`` appends to ``trainer.pending`` (one per
     call: each channel's loss, its off reason for this batch, DPO margin/accuracy/NLL, error sites),
     the run's :class:`~.config.Channels`, the state ids of the global batch (``trainer.batch_states``)
     and TRL's latest ``reward``/``reward_std`` (``trainer._metrics["train"]``, a private TRL store pinned
     by ``tests/train/test_trl_pins.py``).
Out: :class:`StepLog` appends each step's line to a list and hands it to ``on_step`` (the CLI prints it,
     Pipes logs it); the keys are ``step``, ``grpo``/``sdpo``/``dpo`` (``null`` when off), ``total``
     (the weighted sum), ``off`` and ``off_reasons``, ``states``, ``dpo_batches``, ``dpo_margin``,
     ``dpo_accuracy``, ``dpo_sft``, ``dpo_dpop`` (DPOP's penalty term, variant dpop), ``error_sites``, ``sdpo_divergence`` (when channel 2 is on) and ``taid_t``
     (the TAID t the step used), ``reward``, ``reward_std`` (absent when no channel reads rollouts: none were sampled),
     ``step_time_s``.
     :func:`reduce_over_ranks` turns one rank's micro-batch record into the global one under DDP.

Deliberately simplified: a step's value is the plain mean of its micro-batches' values.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from composer_pipeline.train import distributed
from composer_pipeline.train.config import CHANNELS, Channels

# logged values that are means over the ranks under DDP (error_sites is a sum)
RANK_MEANS = ("grpo", "sdpo", "dpo", "dpo_margin", "dpo_accuracy", "dpo_sft", "dpo_dpop")


def reduce_over_ranks(rec: dict[str, Any], world: int) -> dict[str, Any]:
    """This micro-batch's logged values over all ranks (each rank's term is 1/N of the global one).
    Every rank must call it (an all-reduce)."""
    local = [rec.get(k, 0.0) for k in RANK_MEANS] + [rec.get("error_sites", 0)]
    summed = distributed.all_reduce_sum(local)
    for k, v in zip(RANK_MEANS, summed[:-1]):
        if k in rec:
            rec[k] = v / world
    if "sdpo" in rec:
        rec["error_sites"] = int(summed[-1])
    return rec


def step_record(
    pend: list[dict[str, Any]],
    channels: Channels,
    states: list[str],
    train_metrics: dict[str, list],
    step: int,
    step_time: float,
) -> dict[str, Any]:
    """Average one optimizer step's micro-batch records into the logged JSON line (``train_metrics``:
    TRL's per-mode metric lists, of which the latest ``reward``/``reward_std`` are logged)."""
    rec: dict[str, Any] = {"step": step}
    off: dict[str, str] = dict(channels.off_reasons)
    for p in pend:
        for ch, why in p["off"].items():
            off.setdefault(ch, why)
    total = 0.0
    for ch in CHANNELS:
        vals = [p[ch] for p in pend if ch in p]
        if vals and channels.on(ch):
            off.pop(ch, None)
            rec[ch] = sum(vals) / len(vals)
            total += channels.weight(ch) * rec[ch]
        else:
            rec[ch] = None
    rec["total"] = total
    rec["off"] = sorted(off)
    rec["off_reasons"] = off
    rec["states"] = list(states)
    if any("dpo_batch" in p for p in pend):
        rec["dpo_batches"] = sorted({p["dpo_batch"] for p in pend if "dpo_batch" in p})
    # the hint channel's divergence, TAID's t of this step
    for k in ("sdpo_divergence", "taid_t"):
        if any(k in p for p in pend):
            rec[k] = next(p[k] for p in pend if k in p)
    for k in ("dpo_margin", "dpo_accuracy", "dpo_sft", "dpo_dpop", "error_sites"):
        vals = [p[k] for p in pend if k in p]
        if vals:
            rec[k] = sum(vals) / len(vals)
    # GRPO's loss sits near 0 on-policy; a reward spread means a real gradient
    for key in ("reward", "reward_std"):
        logged = train_metrics.get(key)
        # else the "rollouts" are placeholders nobody sampled
        if logged and channels.reads_rollouts:
            rec[key] = logged[-1]
    rec["step_time_s"] = step_time
    return rec


class StepLog(TrainerCallback):
    """Turns each optimizer step's micro-batch records into one logged line (``losses``, ``on_step``)."""

    def __init__(self, trainer, losses: list[dict[str, Any]], on_step: Callable[[dict], None] | None):
        self.trainer, self.losses, self.on_step = trainer, losses, on_step
        self.t0 = time.perf_counter()

    def on_step_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        tr = self.trainer
        pend, tr.pending = tr.pending, []
        rec = step_record(
            pend, tr.channels, tr.batch_states, tr._metrics["train"], state.global_step, time.perf_counter() - self.t0
        )
        tr.after_step(rec)
        self.losses.append(rec)
        if self.on_step is not None:
            self.on_step(rec)
