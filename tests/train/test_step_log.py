"""The per-step log line (train/step_log.py ``step_record``) from micro-batch records, without a model: the
values a step logs are the means of its micro-batches, the total is the channel-weighted sum, and an off
channel is ``null`` with its reason. The records are the shape ``ThreeChannelTrainer._compute_loss``
writes (tests/train/test_trainer.py runs them end to end through the ``StepLog`` callback)."""

from __future__ import annotations

import pytest

from composer_pipeline.train.config import Weights, decide_channels
from composer_pipeline.train.step_log import step_record

# TRL's per-step lists: the latest is logged
REWARDS = {"reward": [0.2, 0.7], "reward_std": [0.1, 0.3]}


def _record(pending, *, sdpo=0.5, pairs=True, step=1, step_time=0.1):
    channels = decide_channels(Weights(grpo=1.0, sdpo=sdpo, dpo=0.5), has_error_sites=True, has_pairs=pairs)
    return step_record(pending, channels, ["s1", "s2"], REWARDS, step, step_time)


def test_micro_batches_are_averaged_and_weighted_into_the_total():
    # two micro-batches (gradient accumulation 2): the second had no error site
    pending = [
        {
            "off": {},
            "grpo": 0.2,
            "sdpo": 0.4,
            "error_sites": 2,
            "dpo": 0.6,
            "dpo_margin": 1.0,
            "dpo_accuracy": 1.0,
            "dpo_batch": 0,
        },
        {
            "off": {"sdpo": "no error site in this batch"},
            "grpo": 0.4,
            "dpo": 0.8,
            "dpo_margin": 3.0,
            "dpo_accuracy": 0.5,
            "dpo_batch": 1,
        },
    ]
    rec = _record(pending, step=7, step_time=1.5)
    assert rec["grpo"] == pytest.approx(0.3) and rec["sdpo"] == pytest.approx(0.4) and rec["dpo"] == pytest.approx(0.7)
    assert rec["total"] == pytest.approx(1.0 * 0.3 + 0.5 * 0.4 + 0.5 * 0.7)
    # one micro-batch fed SDPO: the step is not off
    assert rec["off"] == [] and rec["off_reasons"] == {}
    assert (
        rec["dpo_batches"] == [0, 1]
        and rec["dpo_margin"] == 2.0
        and rec["dpo_accuracy"] == 0.75
        and rec["error_sites"] == 2
    )
    assert (rec["reward"], rec["reward_std"], rec["states"], rec["step"], rec["step_time_s"]) == (
        0.7,
        0.3,
        ["s1", "s2"],
        7,
        1.5,
    )


def test_off_channels_log_null_with_their_reason():
    # SDPO on for the run but no error site in any micro-batch of this step; DPO off for the run
    pending = [{"off": {"sdpo": "no error site in this batch"}, "grpo": 0.2}] * 2
    rec = _record(pending, pairs=False)
    assert rec["sdpo"] is None and rec["dpo"] is None and rec["grpo"] == pytest.approx(0.2)
    assert rec["off"] == ["dpo", "sdpo"]
    assert rec["off_reasons"] == {"sdpo": "no error site in this batch", "dpo": "no DPO pairs in the training data"}
    assert rec["total"] == pytest.approx(0.2) and "dpo_batches" not in rec and "error_sites" not in rec


def test_a_value_of_a_channel_off_for_the_run_is_not_logged():
    rec = _record([{"off": {}, "grpo": 0.2, "sdpo": 9.0}], sdpo=0.0)
    assert rec["sdpo"] is None and rec["off_reasons"]["sdpo"] == "weight 0" and rec["total"] == pytest.approx(0.2)
