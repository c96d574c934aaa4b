"""GRPO's prompt order: error sites first in each step's block (the default, for the hint channel) or
a seeded shuffle (``grpo.data_order: shuffled``, the read-before-edit experiment's control for what
that order alone does). TRL does not reshuffle, so the dataset order is the order the steps see."""

from __future__ import annotations

import random
from dataclasses import replace

from composer_pipeline.train.config import TrainRecipe
from composer_pipeline.train.data import interleave_error_sites
from composer_pipeline.train.run import build_trainer


def test_grpo_prompts_come_error_sites_first_or_in_a_seeded_shuffle(tiny_model_dir, synth_store, tmp_path):
    r = TrainRecipe.from_dict(
        {
            "model": str(tiny_model_dir),
            "weights": {"grpo": 1.0, "sdpo": 0.0, "dpo": 0.0},
            "grpo": {"max_completion_length": 8, "num_generations": 2, "prompts_per_step": 2},
            "data": {"max_prompt_tokens": 64, "heldout_fraction": 0.0},
            "optim": {"seed": 3},
        }
    )
    first = build_trainer(synth_store, r, out_dir=tmp_path / "a")
    shuffled = build_trainer(
        synth_store, replace(r, grpo=replace(r.grpo, data_order="shuffled")), out_dir=tmp_path / "b"
    )
    prompts = first.data.prompts
    a, b = first.trainer.train_dataset["state_id"], shuffled.trainer.train_dataset["state_id"]
    assert a == [p.state_id for p in interleave_error_sites(prompts, 2, 3)]
    assert b == [p.state_id for p in random.Random(3).sample(prompts, len(prompts))]
    assert a != b and sorted(a) == sorted(b)
    hints = {p.state_id: p.hint is not None for p in prompts}
    assert sum(hints.values()) >= len(a) // 2 and all(
        hints[a[i]] for i in range(0, len(a), 2)
    )  # each block opens with one
