"""Learning regression test (seconds): a few DPO steps through the real trainer must raise the held-out
chosen-vs-rejected log-prob margin.

The held-out pairs are other files than the trained ones; their margin is measured here with the
policy's own log-probs (not the trainer's logged margin), so a flipped DPO sign, chosen and rejected
swapped in the batches, or a loss that does not reach the weights all make it fail. Plain DPO (no NLL
term), so the preference term alone has to do it. The probe's half of the regression test (scripted
policies through ``probe()``) is in tests/experiments/test_probe_scripted.py.
"""

from __future__ import annotations

import orjson
import pyarrow as pa
import torch

from composer_pipeline import tables
from composer_pipeline.store import Store
from composer_pipeline.train.config import TrainRecipe
from composer_pipeline.train.data import render_chat_prompt
from composer_pipeline.train.losses import completion_logps
from composer_pipeline.train.modeling import load_policy
from composer_pipeline.train.run import train
from tests.support.synthetic_train import pair_rows

# pairs of files mod0..mod11 train; mod12..mod23 are held out
TRAIN, HELD = 12, 24


def _store(root, rows) -> str:
    store = Store(str(root))
    store.write_table(
        "pairs", tables.conform(pa.Table.from_pylist([r for r in rows if r["kind"] == "pair"]), "normalized_dpo_pairs")
    )
    store.write_table(
        "positives",
        tables.conform(pa.Table.from_pylist([r for r in rows if r["kind"] == "positive"]), "agreement_positives"),
    )
    return str(root)


def heldout_margin(model_dir, rows) -> float:
    """Mean over held-out pairs of log p(chosen | prompt) − log p(rejected | prompt)."""
    tok, model = load_policy(str(model_dir))
    model.eval()
    eos = tok.eos_token or ""
    margins = []
    with torch.no_grad():
        for r in rows:
            p = tok(
                render_chat_prompt(tok, orjson.loads(r["prompt"]), orjson.loads(r["tools"]), 128),
                add_special_tokens=False,
            )["input_ids"]
            lp = []
            for side in ("chosen_text", "rejected_text"):
                c = tok(r[side] + eos, add_special_tokens=False)["input_ids"][:64]
                lp.append(
                    completion_logps(
                        model,
                        torch.tensor([p]),
                        torch.ones(1, len(p), dtype=torch.long),
                        torch.tensor([c]),
                        torch.ones(1, len(c), dtype=torch.long),
                    ).item()
                )
            margins.append(lp[0] - lp[1])
    return sum(margins) / len(margins)


def _direction(r) -> str:
    return "Edit over Read" if '"name":"Edit"' in r["chosen_text"] else "Read over Edit"


def test_a_few_dpo_steps_raise_the_heldout_margin(tiny_model_dir, tmp_path):
    """Pairs in both directions (Read over an Edit of an unread file, Edit over a second Read of a read
    one), each direction's held-out margin measured apart: "always Read" raises one and lowers the other."""
    rows = pair_rows(HELD, both_directions=True)
    held = [r for r in rows[TRAIN:] if r["kind"] == "pair"]
    assert {_direction(r) for r in rows[:TRAIN] if r["kind"] == "pair"} == {"Edit over Read", "Read over Edit"}
    root = _store(tmp_path / "data", rows[:TRAIN])
    recipe = TrainRecipe.from_dict(
        {
            "model": str(tiny_model_dir),
            "weights": {"grpo": 0.0, "sdpo": 0.0, "dpo": 1.0},
            "grpo": {"max_completion_length": 8, "num_generations": 2, "prompts_per_step": 1},
            "dpo": {"batch_size": 4, "sft_weight": 0.0, "beta": 0.1},
            "data": {"max_prompt_tokens": 128, "heldout_fraction": 0.0},
            "optim": {"learning_rate": 3e-3, "seed": 0},
        }
    )
    by_dir = {d: [r for r in held if _direction(r) == d] for d in ("Read over Edit", "Edit over Read")}
    assert all(by_dir.values())
    before = {d: heldout_margin(tiny_model_dir, rs) for d, rs in by_dir.items()}
    res = train(root, recipe, steps=6, out_dir=tmp_path / "run")
    after = {d: heldout_margin(res.checkpoint, rs) for d, rs in by_dir.items()}
    logged = [r["dpo_margin"] for r in res.losses]
    # the trainer's own margin on its training pairs rises too (the ln 2 start is checked in test_trainer)
    assert logged[-1] > logged[0], logged
    for d in by_dir:
        assert after[d] - before[d] > 5.0, f"held-out {d} margin {before[d]:.3f} -> {after[d]:.3f} after 6 DPO steps"
