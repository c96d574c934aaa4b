"""Held-out evaluation of one policy checkpoint (the domain part of the ``policy_eval`` asset).

In:  a checkpoint (model dir or name), the data root (or an already loaded :class:`TrainData`),
     the :class:`~composer_pipeline.train.config.TrainRecipe` (held-out fraction, rewards, JSD settings).
Out: a dict of metrics, each with the number of rows it was computed on:

* ``preference_accuracy`` — share of held-out pairs where log p(chosen) > log p(rejected)
  (summed completion log-probs), plus ``mean_margin``.
* ``reward`` — per reward function and weighted total, on greedy completions for held-out prompts.
* ``hint_jsd`` — generalized JSD between the hinted and unhinted contexts on the model's own greedy
  completion at held-out error sites (lower: the model already behaves as if it had the hint).

A metric with no held-out rows is ``None`` with a ``reason`` (never a silent 0); an evaluation on fewer
than ``eval.min_rows_to_measure`` rows measured nothing, and :func:`measured` / :func:`smoke_line` say
so (the demo trains on a handful of pairs: a smoke run, not a measurement). Greedy decoding
and a fixed seed make it deterministic for a given checkpoint. Run it on the new checkpoint and
on the one training started from; a regression check compares the two dicts.

Deliberately simplified: held-out prompts are capped (``eval.max_prompts``) and batched in one go.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _pad_left(rows: list[list[int]], pad: int):
    import torch

    w = max(map(len, rows))
    ids = torch.tensor([[pad] * (w - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (w - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def _pad_right(rows: list[list[int]], pad: int):
    import torch

    w = max(max(map(len, rows)), 1)
    ids = torch.tensor([r + [pad] * (w - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (w - len(r)) for r in rows])
    return ids, mask


def evaluate_policy(model_path: str | Path, data, recipe) -> dict[str, Any]:
    """Metrics of ``model_path`` on the held-out split of ``data`` (a Store root or TrainData)."""
    import torch

    from composer_pipeline.train import rewards as reward_mod
    from composer_pipeline.train.data import TrainData, grpo_records, load_train_data, render_prompt
    from composer_pipeline.train.losses import completion_logits, completion_logps, generalized_jsd
    from composer_pipeline.train.config import TrainRecipe
    from composer_pipeline.train.modeling import load_policy, resolve_model_path

    recipe = recipe if isinstance(recipe, TrainRecipe) else TrainRecipe.load(recipe)
    if not isinstance(data, TrainData):
        data = load_train_data(
            str(data),
            heldout_fraction=recipe.data.heldout_fraction,
            hints=recipe.sdpo.hint,
            include_unpaired_states=recipe.data.include_unpaired_states,
            render_recipe=recipe.data.render_recipe,
        )
    torch.manual_seed(recipe.optim.seed)
    tok, model = load_policy(resolve_model_path(str(model_path)))
    model.eval()
    dev = model.device
    pad = tok.pad_token_id
    eos = tok.eos_token or ""
    out: dict[str, Any] = {"model": str(model_path), "heldout": data.summary()}
    out["heldout"].pop("skipped", None)

    with torch.no_grad():
        # -- preference accuracy on held-out pairs
        pairs = data.heldout_pairs
        if pairs:
            prompts, comps = [], []
            for side in ("chosen_text", "rejected_text"):
                for p in pairs:
                    prompts.append(
                        tok(
                            render_prompt(tok, p.messages, p.tools, recipe.data.max_prompt_tokens),
                            add_special_tokens=False,
                        )["input_ids"]
                    )
                    comps.append(
                        tok(getattr(p, side) + eos, add_special_tokens=False)["input_ids"][
                            : recipe.dpo.max_completion_tokens
                        ]
                    )
            pi, pm = _pad_left(prompts, pad)
            ci, cm = _pad_right(comps, pad)
            lp = completion_logps(model, pi.to(dev), pm.to(dev), ci.to(dev), cm.to(dev)).float().cpu()
            n = len(pairs)
            margin = lp[:n] - lp[n:]
            out["preference_accuracy"] = {
                "value": float((margin > 0).float().mean()),
                "mean_margin": float(margin.mean()),
                "n": n,
            }
        else:
            out["preference_accuracy"] = {"value": None, "n": 0, "reason": "no held-out pairs"}

        # -- reward on held-out prompts, greedy completions
        rows = data.heldout_prompts[: recipe.eval.max_prompts]
        if rows:
            recs = grpo_records(tok, rows, recipe.data.max_prompt_tokens, recipe.sdpo.hint.role)
            enc = [tok(r["prompt"], add_special_tokens=False)["input_ids"] for r in recs]
            pi, pm = _pad_left(enc, pad)
            gen = model.generate(
                input_ids=pi.to(dev),
                attention_mask=pm.to(dev),
                do_sample=False,
                max_new_tokens=recipe.eval.max_new_tokens,
                pad_token_id=pad,
            )
            comp_ids = gen[:, pi.size(1) :].cpu()
            texts = tok.batch_decode(comp_ids, skip_special_tokens=True)
            kwargs = {k: [r[k] for r in recs] for k in recs[0] if k != "prompt"}
            per_fn: dict[str, Any] = {}
            weights = recipe.grpo.reward_weights or [1.0] * len(recipe.grpo.rewards)
            total = 0.0
            for name, wgt, fn in zip(recipe.grpo.rewards, weights, reward_mod.resolve(recipe.grpo.rewards)):
                vals = [v for v in fn([r["prompt"] for r in recs], texts, **kwargs) if v is not None]
                per_fn[name] = {"mean": sum(vals) / len(vals) if vals else None, "n": len(vals)}
                if vals:
                    total += wgt * per_fn[name]["mean"]
            out["reward"] = {"value": total, "per_function": per_fn, "n": len(rows)}

            # -- hint-JSD at held-out error sites, on the model's own completion
            idx = [i for i, r in enumerate(recs) if r["hint_prompt"]]
            if idx:
                cids = [comp_ids[i].tolist() for i in idx]
                cids = [c[: c.index(pad)] if pad in c else c for c in cids]
                cids = [c or [tok.eos_token_id] for c in cids]
                ci, cm = _pad_right(cids, pad)
                si, sm = _pad_left([enc[i] for i in idx], pad)
                hi, hm = _pad_left(
                    [tok(recs[i]["hint_prompt"], add_special_tokens=False)["input_ids"] for i in idx], pad
                )
                s = completion_logits(model, si.to(dev), sm.to(dev), ci.to(dev), cm.to(dev))
                t = completion_logits(model, hi.to(dev), hm.to(dev), ci.to(dev), cm.to(dev))
                jsd = generalized_jsd(s, t, cm.to(dev), beta=recipe.sdpo.jsd_beta, temperature=recipe.sdpo.temperature)
                out["hint_jsd"] = {"value": float(jsd), "n": len(idx)}
            else:
                out["hint_jsd"] = {"value": None, "n": 0, "reason": "no held-out error sites"}
        else:
            out["reward"] = {"value": None, "n": 0, "reason": "no held-out prompts"}
            out["hint_jsd"] = {"value": None, "n": 0, "reason": "no held-out prompts"}
    return out


# what measures learning in this project (bench/RESULTS.md, "Learning benchmark")
LEARNING_COMMAND = "composer-pipeline experiment read-before-edit --out runs/rbe --seeds 5"


def measured(metrics: dict[str, Any], min_rows: int) -> tuple[bool, int]:
    """Whether an evaluation measured anything: its largest held-out row count among the metrics that
    compare policies (preference accuracy, reward) is at least ``min_rows``. Returns (measured, rows)."""
    rows = max([(metrics.get(k) or {}).get("n") or 0 for k in ("preference_accuracy", "reward")] or [0])
    return rows >= min_rows, rows


def smoke_line(train_pairs: int | None, eval_rows: int, min_rows: int) -> str:
    """The one plain line for an evaluation too small to measure learning."""
    pairs = "?" if train_pairs is None else str(train_pairs)
    return (
        f"eval: a smoke run: training saw {pairs} DPO pairs and the evaluation {eval_rows} held-out rows "
        f"(fewer than {min_rows}), too few to measure learning; `{LEARNING_COMMAND}` measures it (bench/RESULTS.md)"
    )


def compare(before: dict[str, Any], after: dict[str, Any], *, tolerance: float = 0.0) -> dict[str, Any]:
    """Regression verdict per metric: higher is better except ``hint_jsd``. Metrics with no rows are skipped."""
    verdict: dict[str, Any] = {}
    for key, higher_better in (("preference_accuracy", True), ("reward", True), ("hint_jsd", False)):
        b, a = before.get(key, {}).get("value"), after.get(key, {}).get("value")
        if b is None or a is None:
            verdict[key] = {"checked": False, "reason": "no held-out rows"}
            continue
        delta = a - b
        regressed = delta < -tolerance if higher_better else delta > tolerance
        verdict[key] = {"checked": True, "before": b, "after": a, "delta": delta, "regressed": regressed}
    verdict["passed"] = not any(v.get("regressed") for v in verdict.values() if isinstance(v, dict))
    return verdict
