"""The channel decision (train/config.py ``decide_channels``): each channel off for its stated reason, on
otherwise, and never all off. Pure: no model, no data files. The same reasons reach the step log through
the trainer (tests/train/test_trainer.py ``test_absent_inputs_are_reported_off``)."""

from __future__ import annotations

import pytest

from composer_pipeline.train.config import CHANNELS, Weights, decide_channels


def test_every_channel_on_when_weighted_and_fed():
    ch = decide_channels(Weights(grpo=1.0, sdpo=0.5, dpo=0.25), has_error_sites=True, has_pairs=True)
    assert ch.off_reasons == {}
    assert [ch.on(c) for c in CHANNELS] == [True, True, True]
    assert [ch.weight(c) for c in CHANNELS] == [1.0, 0.5, 0.25]


@pytest.mark.parametrize(
    "weights,error_sites,pairs,off",
    [
        (Weights(grpo=0.0, sdpo=0.5, dpo=0.5), True, True, {"grpo": "weight 0"}),
        (Weights(grpo=1.0, sdpo=0.0, dpo=0.5), True, True, {"sdpo": "weight 0"}),
        (Weights(grpo=1.0, sdpo=0.5, dpo=0.5), False, True, {"sdpo": "no error sites in the training data"}),
        (Weights(grpo=1.0, sdpo=0.5, dpo=0.0), True, True, {"dpo": "weight 0"}),
        (Weights(grpo=1.0, sdpo=0.5, dpo=0.5), True, False, {"dpo": "no DPO pairs in the training data"}),
        # a zero weight is the reason even where the data has no input for the channel either
        (Weights(grpo=1.0, sdpo=0.0, dpo=0.0), False, False, {"sdpo": "weight 0", "dpo": "weight 0"}),
        (
            Weights(grpo=1.0, sdpo=0.5, dpo=0.5),
            False,
            False,
            {"sdpo": "no error sites in the training data", "dpo": "no DPO pairs in the training data"},
        ),
    ],
)
def test_each_channel_off_for_its_stated_reason(weights, error_sites, pairs, off):
    ch = decide_channels(weights, has_error_sites=error_sites, has_pairs=pairs)
    assert ch.off_reasons == off
    assert {c for c in CHANNELS if not ch.on(c)} == set(off)


def test_every_channel_off_is_an_error_naming_the_reasons():
    with pytest.raises(ValueError, match="every channel is off") as e:
        decide_channels(Weights(grpo=0.0, sdpo=0.5, dpo=0.5), has_error_sites=False, has_pairs=False)
    assert "no error sites in the training data" in str(e.value) and "weight 0" in str(e.value)
