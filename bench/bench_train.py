"""Time per training step: three-channel trainer vs plain TRL GRPO, same model, data and batch.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_train.py [--model tiny|PATH] [--steps 8] [--warmup 2]

Both trainers come from ``composer_pipeline.train.run.build_trainer`` with one recipe (the plain
one is TRL's ``GRPOTrainer`` with the same config, dataset and reward functions). Runs alternate
(plain, three, plain, three) so machine load hits both alike; the median of the post-warmup step
times is compared with the FLOP-predicted ratio:

    plain step  = generation (2N·B·(P+C)) + policy forward/backward (6N·B·(P+C))
    three extra = hinted no-grad forward (2N·H·(P_h+C)) + DPO policy fwd/bwd (6N·2b·(P_d+C_d))
                  + DPO reference forward (2N·2b·(P_d+C_d))

with N parameters (tied embeddings once: the LM-head matmul costs what the lookup saves), the padded
shapes actually seen in the steps, attention's quadratic term ignored. Two predictions are printed:
``flop`` (everything by FLOPs) and ``calibrated`` (generation time as measured, which is latency-bound
for small models, and the training part scaled by FLOPs). Target: measured ≤ 1.1 × predicted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _instrument(trainer, cuda: bool):
    import torch
    from transformers import TrainerCallback

    rec = {"gen": [], "step": [], "shapes": []}
    gen = trainer._generate_and_score_completions

    def timed_gen(inputs):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = gen(inputs)
        if cuda:
            torch.cuda.synchronize()
        rec["gen"].append(time.perf_counter() - t)
        return out

    loss = trainer._compute_loss

    def shaped_loss(model, inputs):
        out = loss(model, inputs)
        s = {
            "B": inputs["prompt_ids"].size(0),
            "P": inputs["prompt_ids"].size(1),
            "C": inputs["completion_ids"].size(1),
        }
        if "has_hint" in inputs and "hint_ids" in inputs:
            s["H"] = int(inputs["has_hint"].sum())
            s["Ph"] = inputs["hint_ids"].size(1)
        if getattr(trainer, "dpo_batches", None):
            b = trainer.dpo_batches[trainer.dpo_batch_index]
            s["Bd"], s["Pd"], s["Cd"] = b["prompt_ids"].size(0), b["prompt_ids"].size(1), b["completion_ids"].size(1)
        rec["shapes"].append(s)
        return out

    trainer._generate_and_score_completions = timed_gen
    trainer._compute_loss = shaped_loss

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            rec["step"].append(time.perf_counter() - self.t)

    trainer.add_callback(StepTimer())
    return rec


def run_once(data_root: str, recipe, model: str, steps: int, plain: bool) -> dict:
    import torch

    from composer_pipeline.train.run import build_trainer

    with tempfile.TemporaryDirectory() as tmp:
        built = build_trainer(data_root, recipe, model=model, steps=steps, out_dir=Path(tmp), plain_grpo=plain)
        rec = _instrument(built.trainer, built.cuda)
        built.trainer.train()
        n_params = sum(p.numel() for p in {id(p): p for p in built.trainer.model.parameters()}.values())
        device = torch.cuda.get_device_name(0) if built.cuda else "cpu"
        if built.cuda:
            rec["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        del built
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    rec["n_params"] = n_params
    rec["device"] = device
    return rec


def flops(shapes: list[dict], n: int) -> dict:
    def mean(key, default=0.0):
        vals = [s.get(key, default) for s in shapes]
        return sum(vals) / len(vals)

    B, P, C = mean("B"), mean("P"), mean("C")
    gen = 2 * n * B * (P + C)
    train = 6 * n * B * (P + C)
    hint = 2 * n * mean("H") * (mean("Ph") + C)
    dpo_tokens = mean("Bd") * (mean("Pd") + mean("Cd"))
    dpo = 6 * n * dpo_tokens + 2 * n * dpo_tokens
    return {"gen": gen, "train": train, "hint_fwd": hint, "dpo": dpo}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="'tiny' (offline, built here), a local path or HF name")
    ap.add_argument("--steps", type=int, default=8, help="steps per run (the first --warmup are not timed)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="alternating plain/three rounds")
    ap.add_argument("--completion", type=int, default=32)
    ap.add_argument("--prompts-per-step", type=int, default=2)
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--max-prompt-tokens", type=int, default=384)
    ap.add_argument("--dpo-batch", type=int, default=2)
    ap.add_argument("--tiny-hidden", type=int, default=64, help="hidden size of the tiny model (--model tiny)")
    ap.add_argument("--tiny-layers", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = ap.parse_args()

    from composer_pipeline.tiny_model import build_tiny_model
    from composer_pipeline.train.config import TrainRecipe
    from tests.support.synthetic_train import write_store

    work = Path(tempfile.mkdtemp(prefix="bench-train-"))
    data_root = write_store(work / "data", n=48)
    model = (
        str(build_tiny_model(work / "tiny", hidden=args.tiny_hidden, layers=args.tiny_layers))
        if args.model == "tiny"
        else args.model
    )
    recipe = TrainRecipe.from_dict(
        {
            "model": model,
            "grpo": {
                "max_completion_length": args.completion,
                "num_generations": args.generations,
                "prompts_per_step": args.prompts_per_step,
            },
            "dpo": {"batch_size": args.dpo_batch},
            "data": {"max_prompt_tokens": args.max_prompt_tokens, "heldout_fraction": 0.0},
        }
    )
    runs = {"plain": [], "three": []}
    for _ in range(args.rounds):
        for kind in ("plain", "three"):
            runs[kind].append(run_once(data_root, recipe, model, args.steps, plain=kind == "plain"))

    def post(kind, key):
        return [v for r in runs[kind] for v in r[key][args.warmup :]]

    n = runs["plain"][0]["n_params"]
    t_plain, t_three = statistics.median(post("plain", "step")), statistics.median(post("three", "step"))
    g_plain = statistics.median(post("plain", "gen"))
    f_plain = flops([s for r in runs["plain"] for s in r["shapes"][args.warmup :]], n)
    f_three = flops([s for r in runs["three"] for s in r["shapes"][args.warmup :]], n)
    extra = f_three["hint_fwd"] + f_three["dpo"]
    pred_flop = (f_plain["gen"] + f_plain["train"] + extra) / (f_plain["gen"] + f_plain["train"])
    t_train_plain = max(t_plain - g_plain, 1e-9)
    pred_cal = (g_plain + t_train_plain * (f_plain["train"] + extra) / f_plain["train"]) / t_plain
    measured = t_three / t_plain
    result = {
        "device": runs["plain"][0]["device"],
        "model": args.model,
        "n_params": n,
        "batch": {
            "prompts": args.prompts_per_step,
            "generations": args.generations,
            "completion": args.completion,
            "dpo_pairs": args.dpo_batch,
        },
        "shapes_three_mean": {
            k: statistics.mean(s.get(k, 0) for s in runs["three"][0]["shapes"])
            for k in ("B", "P", "C", "H", "Ph", "Bd", "Pd", "Cd")
        },
        "timed_steps_each": len(post("plain", "step")),
        "plain_step_s": t_plain,
        "plain_gen_s": g_plain,
        "three_step_s": t_three,
        "three_gen_s": statistics.median(post("three", "gen")),
        "measured_ratio": measured,
        "measured_ratio_min": min(post("three", "step")) / min(post("plain", "step")),  # robust to load spikes
        "predicted_ratio_flop": pred_flop,
        "predicted_ratio_calibrated": pred_cal,
        "measured_over_flop_pred": measured / pred_flop,
        "measured_over_calibrated_pred": measured / pred_cal,
        "peak_mem_gib": {k: runs[k][0].get("peak_mem_gib") for k in runs},
        "step_times": {k: [[round(x, 4) for x in r["step"]] for r in runs[k]] for k in runs},
        "gen_times": {k: [[round(x, 4) for x in r["gen"]] for r in runs[k]] for k in runs},
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
