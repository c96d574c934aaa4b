"""The read-before-edit experiment's arms: what each trains, through the normal trainer.

In:  an arm's name (:data:`ARMS`), the train recipe (``recipes/train.yaml``), the experiment's config,
     the seed's start policy and the seed.
Out: the arm's :class:`~composer_pipeline.train.config.TrainRecipe` (:func:`arm_recipe`), and the stores
     the controls read instead of the train store: the pairs' sides swapped at a seeded random half
     (:func:`shuffled_label_store`) and the consensus at every task state that has one
     (:func:`consensus_store`).

Every arm starts from the same start policy and trains the same steps; what differs is the channel
weights and what each control changes (the data it reads, the DPO β, the GRPO prompt order).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from composer_pipeline.actions import Action, ActionOrder
from composer_pipeline.experiments.read_before_edit.config import ExperimentConfig
from composer_pipeline.train.config import LoraSection, TrainRecipe, Weights


@dataclass(frozen=True)
class Arm:
    """One arm: channel weights ``(grpo, sdpo, dpo)`` (``weights.*``) through the normal trainer, plus what the
    controls change (the data it reads, the DPO β, the GRPO prompt order)."""

    weights: tuple[float, float, float]
    # train | error_sites (the hint channel's rows only) | shuffled_labels (chosen/rejected swapped at
    # random) | consensus_all (the consensus at every task state that has one)
    data: Literal["train", "error_sites", "shuffled_labels", "consensus_all"] = "train"
    # None: the recipe's; 0.0: the sigmoid term is a constant ln 2 (no gradient), NLL alone
    dpo_beta: float | None = None
    # or "shuffled": a seeded shuffle (the control for the order)
    grpo_order: Literal["error_sites_first", "shuffled"] = "error_sites_first"
    # the hint channel's loss (sdpo.divergence)
    divergence: Literal["jsd", "taid", "eopd"] = "jsd"

    # None: the recipe's dpo.preference_tokens; else which tokens the preference term sums
    preference_tokens: Literal["all", "differing", "first_differing"] | None = None
    # None: the recipe's dpo.variant; else the preference loss (dpop: DPO-Positive, dpo.dpop_lambda)
    variant: Literal["dpo", "simpo", "dpop"] | None = None


ARMS: dict[str, Arm | None] = {
    "start": None,
    "grpo": Arm((1.0, 0.0, 0.0)),
    "grpo_shuffled": Arm((1.0, 0.0, 0.0), grpo_order="shuffled"),
    "sdpo": Arm((0.0, 1.0, 0.0), data="error_sites"),
    "sdpo_taid": Arm((0.0, 1.0, 0.0), data="error_sites", divergence="taid"),  # TAID instead of the JSD
    "sdpo_eopd": Arm((0.0, 1.0, 0.0), data="error_sites", divergence="eopd"),  # entropy-aware OPD instead
    # RPO: preference term + dpo_sft_weight · NLL on the chosen answers
    "dpo": Arm((0.0, 0.0, 1.0)),
    # the same NLL on the same chosen answers, no preference term
    "nll": Arm((0.0, 0.0, 1.0), dpo_beta=0.0),
    # same pairs, sides swapped at random (seeded)
    "dpo_shuffled": Arm((0.0, 0.0, 1.0), data="shuffled_labels"),
    # the preference term over the tokens where chosen and rejected differ only (+ the same NLL)
    "dpo_differing": Arm((0.0, 0.0, 1.0), preference_tokens="differing"),
    # ... over the first differing token only (the decision; nothing after it is pushed down)
    "dpo_first": Arm((0.0, 0.0, 1.0), preference_tokens="first_differing"),
    # DPO-Positive: the DPO logit less λ · how far the chosen answer fell below the start (+ the same NLL)
    "dpop": Arm((0.0, 0.0, 1.0), variant="dpop"),
    # ... with the margin on the first differing token only (the penalty still reads the whole chosen answer)
    "dpop_first": Arm((0.0, 0.0, 1.0), preference_tokens="first_differing", variant="dpop"),
    # the NLL term on the teachers' consensus at every task state with one (pairs and positives), not
    # only where a pair exists: does selecting the states where the agent disagreed matter?
    "nll_all": Arm((0.0, 0.0, 1.0), data="consensus_all", dpo_beta=0.0),
    "all": Arm((1.0, 1.0, 1.0)),
}


def arm_recipe(base: TrainRecipe, arm: str, cfg: ExperimentConfig, start: Path, seed: int) -> TrainRecipe:
    """The train recipe of ``arm`` for ``seed``: ``base`` from the seed's ``start`` policy with the arm's
    weights and controls and the experiment's sizes."""
    spec = ARMS[arm]
    if spec is None:
        raise ValueError(f"the {arm} arm trains nothing: it has no train recipe")
    grpo, sdpo, dpo_weight = spec.weights
    r = replace(base, model=str(start), weights=Weights(grpo=grpo, sdpo=sdpo, dpo=dpo_weight))
    # The arms define their own loss, not the shipped recipe's DPO defaults (which changed on their
    # results, bench/RESULTS.md): plain DPO over every token unless the arm or the experiment says
    # otherwise, and the pairs in the table's order, as every committed cell ran. nll_all orders its own
    # rows (consensus_store).
    dpo = replace(
        r.dpo,
        variant="dpo",
        preference_tokens="all",
        data_order="table",
        max_completion_tokens=cfg.max_new_tokens,
        sft_weight=cfg.dpo_sft_weight,
    )
    if spec.dpo_beta is not None:
        dpo = replace(dpo, beta=spec.dpo_beta)
    tokens = spec.preference_tokens or cfg.preference_tokens
    if tokens is not None:
        dpo = replace(dpo, preference_tokens=tokens)
    # the experiment's variant reaches only arms whose preference term is live (NLL-only arms keep β 0)
    variant = spec.variant or (cfg.dpo_variant if spec.dpo_beta != 0.0 else None)
    if variant is not None:
        dpo = replace(dpo, variant=variant)
    r = replace(
        r,
        optim=replace(r.optim, steps=cfg.steps, seed=seed, learning_rate=cfg.learning_rate),
        data=replace(
            r.data, heldout_fraction=0.0, max_prompt_tokens=cfg.prompt_tokens, render_recipe=render_recipe(cfg)
        ),
        # 96 tokens hold a whole Edit call (~80 with the tiny tokenizer): a shorter limit cuts every
        # Edit rollout into an unparseable one and so rewards reading everywhere
        grpo=replace(
            r.grpo,
            max_completion_length=cfg.max_new_tokens,
            num_generations=4,
            prompts_per_step=2,
            data_order=spec.grpo_order,
        ),
        dpo=dpo,
        sdpo=replace(r.sdpo, teacher=cfg.hint_teacher, divergence=spec.divergence),
        lora=LoraSection(enabled=cfg.lora, r=16, alpha=32) if cfg.lora else r.lora,
    )
    return r


def shuffled_label_store(train_root: str, out_root: Path, seed: int) -> str:
    """A copy of the train store whose pairs have chosen and rejected swapped at a seeded random half
    of the rows (same prompts, same answers): the DPO arm's control for "the labels carry it"."""

    import pyarrow as pa

    from composer_pipeline.store import Store

    if (out_root / "pairs.parquet").is_file():
        return str(out_root)
    src, dst = Store(train_root), Store(str(out_root))
    pairs = src.read_table("pairs")
    rng = random.Random(f"shuffled-labels|{seed}")
    swap = [rng.random() < 0.5 for _ in range(pairs.num_rows)]
    cols = {}
    for a, b in (("chosen", "rejected"), ("chosen_text", "rejected_text")):
        xa, xb = pairs.column(a).to_pylist(), pairs.column(b).to_pylist()
        cols[a] = [y if s else x for x, y, s in zip(xa, xb, swap)]
        cols[b] = [x if s else y for x, y, s in zip(xa, xb, swap)]
    for name, vals in cols.items():
        pairs = pairs.set_column(
            pairs.schema.get_field_index(name), name, pa.array(vals, pairs.schema.field(name).type)
        )
    for name in ("trace_states", "trace_messages", "positives"):
        dst.write_table(name, src.read_table(name))
    dst.write_table("pairs", pairs)
    return str(out_root)


def render_recipe(cfg: ExperimentConfig) -> str | None:
    """The render recipe the trainer reads (``data.render_recipe``) for ``cfg.action_order``: None for the
    default, else ``<out>/render.yaml`` (written here) holding that order."""
    if cfg.action_order == "sorted":
        return None
    path = Path(cfg.out) / "render.yaml"
    text = f"render:\n  action_order: {cfg.action_order}\n"
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(path)


def consensus_store(train_root: str, out_root: Path, seed: int, order: ActionOrder = "sorted") -> str:
    """A copy of the train store whose ``pairs`` hold the teachers' consensus as the chosen side at every
    task state that has one: the pairs, plus each positive (the agent agreed with the consensus) as a row
    whose rejected side is an empty-text stand-in. For the ``nll_all`` arm only, whose preference term is a
    constant (β 0): the rejected side never reaches a gradient, the NLL reads every consensus answer.

    The rows are in a seeded random order: the trainer takes its DPO batches as consecutive blocks of the
    table, so with the pairs first an arm of fewer steps than pairs trained on the ``nll`` arm's very rows
    (SmolLM2's plan: 30 steps × 2 rows, 61 pairs) and the control measured nothing."""
    import pyarrow as pa

    from composer_pipeline import tables
    from composer_pipeline.store import Store

    if (out_root / "pairs.parquet").is_file():
        return str(out_root)
    src, dst = Store(train_root), Store(str(out_root))
    stand_in = Action(text="(no rejected answer: the agent agreed with the consensus)")
    rows = src.read_table("pairs").to_pylist()
    for r in src.read_table("positives").to_pylist():
        rows.append(
            {
                **r,
                "kind": "pair",
                "pair_id": r.get("pair_id") or f"positive-{r['state_id']}",
                "rejected": stand_in.to_json(),
                "rejected_text": stand_in.to_text(order),
            }
        )
    random.Random(f"consensus-all|{seed}").shuffle(rows)
    dst.write_table("pairs", tables.conform(pa.Table.from_pylist(rows), "normalized_dpo_pairs"))
    for name in ("trace_states", "trace_messages"):
        if src.exists(name):
            dst.write_table(name, src.read_table(name))
    return str(out_root)
