"""Held-out evaluation of one policy checkpoint (the domain part of the ``policy_eval`` asset).

In:  a checkpoint (model dir or name), the data root (or an already loaded :class:`TrainData`),
     the :class:`~composer_pipeline.train.config.TrainRecipe` (held-out fraction, rewards, JSD settings).
Out: a dict of metrics, each with the number of rows it was computed on:

* ``preference_accuracy`` — share of held-out pairs where log p(chosen) > log p(rejected)
  (summed completion log-probs), plus ``mean_margin``.
* ``reward`` — per reward function and weighted total, on greedy completions for held-out prompts.
* ``action_parse_rate`` — share of those greedy completions that parse as a valid action
  (:func:`composer_pipeline.actions.parse_failure`), with the failures counted by reason (``errors``):
  a preference term can raise the margin while it breaks the tool-call format, and this shows it.
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

from composer_pipeline.actions import parse_failure
from composer_pipeline.train import rewards as reward_mod
from composer_pipeline.train.config import TrainRecipe
from composer_pipeline.train.modeling import load_policy, resolve_model_path


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

    from composer_pipeline.train.data import TrainData, grpo_records, load_train_data, render_chat_prompt
    from composer_pipeline.train.losses import completion_logits, completion_logps, generalized_jsd

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
                            render_chat_prompt(tok, p.messages, p.tools, recipe.data.max_prompt_tokens),
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
            recs = grpo_records(tok, rows, recipe.data.max_prompt_tokens, recipe.sdpo.hint.role, data.action_order)
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
            out["action_parse_rate"] = parse_rate(texts)

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
            out["action_parse_rate"] = {"value": None, "n": 0, "reason": "no held-out prompts"}
            out["hint_jsd"] = {"value": None, "n": 0, "reason": "no held-out prompts"}
    return out


def parse_rate(texts: list[str]) -> dict[str, Any]:
    """``{value, n, errors}``: the share of ``texts`` that parse as a valid action, and the failures by reason."""

    errors: dict[str, int] = {}
    for t in texts:
        why = parse_failure(t)
        if why is not None:
            errors[why] = errors.get(why, 0) + 1
    n = len(texts)
    if not n:
        return {"value": None, "n": 0, "errors": {}, "reason": "no completions"}
    return {"value": 1.0 - sum(errors.values()) / n, "n": n, "errors": dict(sorted(errors.items()))}


# metrics that compare two policies, and whether higher is better
COMPARED = (("preference_accuracy", True), ("reward", True), ("action_parse_rate", True), ("hint_jsd", False))
# the ones whose drop fails the no-regression check (hint_jsd is reported, not gated)
GATED = ("preference_accuracy", "reward", "action_parse_rate")


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
    """Regression verdict per metric (:data:`COMPARED`): higher is better except ``hint_jsd``. Metrics with
    no rows are not checked (with the reason). ``passed``: no gated metric (:data:`GATED`) dropped by more
    than ``tolerance``; ``hint_jsd`` is reported, not gated."""
    verdict: dict[str, Any] = {}
    for key, higher_better in COMPARED:
        b, a = (before.get(key) or {}).get("value"), (after.get(key) or {}).get("value")
        if b is None or a is None:
            why = (after.get(key) or {}).get("reason") or (before.get(key) or {}).get("reason") or "no held-out rows"
            verdict[key] = {"checked": False, "reason": why}
            continue
        delta = a - b
        regressed = delta < -tolerance if higher_better else delta > tolerance
        verdict[key] = {"checked": True, "before": b, "after": a, "delta": delta, "regressed": regressed}
    verdict["passed"] = not any(verdict[k].get("regressed") for k in GATED)
    return verdict


def report(
    model: dict[str, Any], baseline: dict[str, Any] | None = None, *, tolerance: float = 0.0, min_rows: int = 30
) -> dict[str, Any]:
    """The one JSON document of ``train eval --json``: every held-out metric as ``{value, n}`` (plus its
    details: ``reason`` when it measured nothing, ``errors`` for the parse rate) for the model and, with a
    baseline, for the baseline, and the comparison (:func:`compare`) with ``measured`` (:func:`measured`
    at ``min_rows``) and its one-line summary ``line`` (:func:`verdict_line`)."""

    def metrics(ev: dict[str, Any]) -> dict[str, Any]:
        return {
            k: {
                "value": (ev.get(k) or {}).get("value"),
                "n": (ev.get(k) or {}).get("n") or 0,
                **{x: y for x, y in (ev.get(k) or {}).items() if x not in ("value", "n")},
            }
            for k, _ in COMPARED
        }

    doc: dict[str, Any] = {
        "model": {"path": model.get("model"), "metrics": metrics(model)},
        "heldout": model.get("heldout"),
    }
    if baseline is not None:
        doc["baseline"] = {"path": baseline.get("model"), "metrics": metrics(baseline)}
        verdict = compare(baseline, model, tolerance=tolerance)
        was, rows = measured(model, min_rows)
        doc["comparison"] = {
            **verdict,
            "measured": was,
            "line": verdict_line(verdict, measured_rows=rows, min_rows=min_rows),
        }
    return doc


def _r(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def verdict_line(verdict: dict[str, Any], *, measured_rows: int | None = None, min_rows: int | None = None) -> str:
    """One line: what improved, what regressed, what could not be measured and why (rounded numbers).
    With ``measured_rows`` under ``min_rows`` the whole comparison measured nothing, and the line says so."""
    up, down, same, unmeasured = [], [], [], []
    for key, higher_better in COMPARED:
        v = verdict.get(key) or {}
        if not v.get("checked"):
            unmeasured.append(f"{key} ({v.get('reason', 'not compared')})")
            continue
        text = f"{key} {_r(v['before'])} -> {_r(v['after'])}"
        better = v["delta"] > 0 if higher_better else v["delta"] < 0
        if v["regressed"]:
            down.append(text)
        elif abs(v["delta"]) < 5e-4:
            same.append(text)
        elif better:
            up.append(text)
        else:
            same.append(text + " (within tolerance)")
    parts = []
    if measured_rows is not None and min_rows is not None and measured_rows < min_rows:
        parts.append(f"measured nothing: {measured_rows} held-out rows (fewer than {min_rows})")
    parts.append("improved: " + (", ".join(up) or "none"))
    parts.append("regressed: " + (", ".join(down) or "none"))
    if same:
        parts.append("unchanged: " + ", ".join(same))
    if unmeasured:
        parts.append("not measured: " + ", ".join(unmeasured))
    return "; ".join(parts)
