"""Writing the trained policy: the checkpoint directory the trainer hands back.

In:  the final model (LoRA adapters already merged), its tokenizer, the recipe, the per-step log lines
     (:mod:`.step_log`), the channels off (:class:`~.config.Channels`) and the facts of the run.
Out: :func:`write_checkpoint` -> ``checkpoint/`` with safetensors + tokenizer + ``train.yaml`` (the
     recipe as run) + ``losses.jsonl`` + ``metrics.json`` + one loss-curve PNG per channel
     (:mod:`.plots`); it returns the metrics and the plots. The metrics hold two sanity values: the
     max logit difference between the in-memory model and the reloaded checkpoint (should be 0) and,
     for plain DPO, the first step's preference loss against ln 2 (policy == frozen reference at step 1).

Deliberately simplified: rank 0 alone writes (every rank holds the same weights); a checkpoint at the
end of the run only (TRL's own ``save_strategy`` is ``no``), no optimizer state to resume from.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import torch
import yaml

from composer_pipeline.train.config import CHANNELS, DPOSection, TrainRecipe
from composer_pipeline.train.plots import plot_losses


def reload_max_abs_diff(model, tok, ckpt: Path) -> float:
    """Max |logit difference| between the in-memory final model and the saved checkpoint (should be 0)."""
    from transformers import AutoModelForCausalLM

    probe = tok(["<tool_call>", "def main():\n    return 0"], return_tensors="pt", padding=True)
    reloaded = AutoModelForCausalLM.from_pretrained(ckpt, dtype=model.dtype).to(model.device).eval()
    was_training = model.training
    model.eval()
    with torch.no_grad():
        a = model(**{k: v.to(model.device) for k, v in probe.items()}).logits
        b = reloaded(**{k: v.to(model.device) for k, v in probe.items()}).logits
    model.train(was_training)
    return float((a.float() - b.float()).abs().max())


def ln2_check(first: dict[str, Any], losses: list[dict[str, Any]], dpo: DPOSection) -> dict[str, Any] | None:
    """Plain DPO's first-step preference loss (the logged ``dpo`` less ``sft_weight`` · NLL) against ln 2:
    the sign that the reference log-probs were really computed (DPO and DPOP). None for SimPO, cDPO, or DPO off."""
    first_dpo = first["dpo"]
    # the sanity value is the preference part alone
    if first_dpo is not None and dpo.sft_weight:
        first_dpo -= dpo.sft_weight * next(r["dpo_sft"] for r in losses if r.get("dpo_sft") is not None)
    # DPOP's penalty is 0 at the first step (policy == reference), so its first loss is ln 2 as well
    if first_dpo is not None and dpo.variant in ("dpo", "dpop") and dpo.label_smoothing == 0:
        return {"first_dpo_loss": first_dpo, "ln2": math.log(2), "ok": abs(first_dpo - math.log(2)) < 1e-3}
    return None


def write_checkpoint(
    ckpt: Path,
    model,
    tokenizer,
    recipe: TrainRecipe,
    losses: list[dict[str, Any]],
    *,
    off: dict[str, str],
    data_summary: dict[str, Any],
    model_path: str,
    cuda: bool,
    world_size: int,
    train_seconds: float,
) -> tuple[dict[str, Any], dict[str, Path]]:
    """Write ``ckpt`` (replacing one that is there); returns ``(metrics, plots)``."""
    if ckpt.exists():
        shutil.rmtree(ckpt)
    model.save_pretrained(ckpt, safe_serialization=True)
    tokenizer.save_pretrained(ckpt)
    reload_diff = reload_max_abs_diff(model, tokenizer, ckpt)
    (ckpt / "train.yaml").write_text(yaml.safe_dump(recipe.to_dict(), sort_keys=False))
    with (ckpt / "losses.jsonl").open("w") as f:
        for rec in losses:
            f.write(json.dumps(rec) + "\n")
    plots = plot_losses(losses, ckpt, off_reasons=off)
    metrics = {
        "model": model_path,
        "device": "cuda" if cuda else "cpu",
        "world_size": world_size,
        "dtype": str(model.dtype).removeprefix("torch."),
        "steps": len(losses),
        "train_seconds": train_seconds,
        "mean_step_seconds": sum(r["step_time_s"] for r in losses) / max(len(losses), 1),
        "channels_off": off,
        "final": {
            ch: next((r[ch] for r in reversed(losses) if r.get(ch) is not None), None) for ch in (*CHANNELS, "total")
        },
        "first": {ch: next((r[ch] for r in losses if r.get(ch) is not None), None) for ch in (*CHANNELS, "total")},
        "data": data_summary,
        "ln2_check": None,
        "reload_max_abs_logit_diff": reload_diff,
    }
    metrics["ln2_check"] = ln2_check(metrics["first"], losses, recipe.dpo)
    (ckpt / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str))
    return metrics, plots
