"""The experiment's presets (recipes/experiments/read_before_edit/*.yaml): each loads strictly through the
settings layer, the presets that replaced ``--quick`` and ``--model smollm2`` give the sizes those forms
gave (so their runs' cells still resume), and an explicit flag overrides the preset's key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from composer_pipeline import settings
from composer_pipeline.cli import build_parser
from composer_pipeline.cli.experiment import experiment_config
from composer_pipeline.experiments.read_before_edit.config import PRESETS, ExperimentConfig, load_config
from composer_pipeline.experiments.read_before_edit.run import _check_config

NAMES = sorted(p.stem for p in PRESETS.glob("*.yaml"))


def _cli(tmp_path: Path, *flags: str) -> ExperimentConfig:
    args = build_parser().parse_args(["experiment", "read-before-edit", "--out", str(tmp_path), *flags])
    return experiment_config(args)


def test_the_presets_are_the_known_ones(capsys):
    assert NAMES == ["default", "fmt", "quick", "smollm2", "smollm2_plan"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["experiment", "read-before-edit", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert all(name in help_text for name in NAMES), "the --recipe help names every preset"


@pytest.mark.parametrize("name", NAMES)
def test_each_preset_loads_strictly_with_known_arms(name, tmp_path):
    path = PRESETS / f"{name}.yaml"
    cfg = settings.load(ExperimentConfig, path)
    assert cfg == load_config(name) == load_config(path)
    _check_config(cfg)
    assert load_config(name, tmp_path).out == tmp_path


def test_the_default_preset_is_the_dataclass_defaults(tmp_path):
    assert load_config("default", tmp_path) == ExperimentConfig(out=tmp_path) == _cli(tmp_path)


def test_quick_and_smollm2_are_the_sizes_they_were(tmp_path):
    """The values of the former ``ExperimentConfig.quick`` / ``.smollm2``: a run made with them resumes."""
    quick: dict[str, Any] = dict(
        model="tiny",
        seeds=1,
        steps=20,
        train_sessions=40,
        heldout_sessions=12,
        sft_steps=150,
        sft_lr=1e-3,
        learning_rate=3e-4,
        eval_every=10,
        pretrain_steps=500,
        arms=("start", "grpo", "sdpo", "dpo", "nll", "dpo_shuffled", "all"),
    )
    smollm2: dict[str, Any] = dict(
        model="local:smollm2-135m-instruct",
        seeds=3,
        steps=30,
        sft_steps=40,
        sft_lr=1e-4,
        learning_rate=3e-5,
        eval_every=15,
        heldout_sessions=24,
        max_new_tokens=72,
        probe_states="decisive",
        prompt_tokens=384,
        arms=("start", "nll", "dpo", "nll_all", "dpo_shuffled"),
    )
    assert _cli(tmp_path, "--quick") == load_config("quick", tmp_path) == ExperimentConfig(out=tmp_path, **quick)
    assert _cli(tmp_path, "--model", "smollm2") == ExperimentConfig(out=tmp_path, **smollm2)
    assert load_config("smollm2_plan", tmp_path) == ExperimentConfig(
        out=tmp_path, **smollm2, preference_tokens="first_differing", dpo_variant="dpop"
    )
    # the fingerprint a finished cell is checked against: the same values, the same types
    fp = load_config("quick", tmp_path).fingerprint()
    assert fp == ExperimentConfig(out=tmp_path, **quick).fingerprint()
    assert [type(fp[k]) for k in ("sft_lr", "steps", "lora")] == [float, int, bool]


def test_a_flag_overrides_the_preset(tmp_path):
    fmt = load_config("fmt", tmp_path)
    cfg = _cli(tmp_path, "--recipe", "fmt", "--steps", "7", "--arms", "start,nll", "--lora")
    assert (cfg.steps, cfg.arms, cfg.lora) == (7, ("start", "nll"), True)
    assert (
        (cfg.seeds, cfg.pretrain_steps, cfg.eval_every)
        == (fmt.seeds, fmt.pretrain_steps, fmt.eval_every)
        == (3, 500, 40)
    )
    quick = _cli(tmp_path, "--quick", "--seeds", "2", "--only-seeds", "1,0")
    assert (quick.seeds, quick.only_seeds, quick.steps) == (2, (1, 0), 20)
    smol = _cli(tmp_path, "--recipe", "smollm2_plan", "--preference-tokens", "differing", "--budget-minutes", "100")
    assert (smol.preference_tokens, smol.budget_minutes, smol.steps) == ("differing", 100.0, 30)


def test_presets_and_flags_are_checked(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: 3\nstepz: 4\n")
    with pytest.raises(ValueError, match=r"bad\.yaml: unknown keys \['stepz'\]"):
        load_config(bad)
    bad.write_text("probe_states: some\n")
    with pytest.raises(ValueError, match=r"probe_states must be one of \['all', 'decisive'\]"):
        load_config(bad)
    # the output directory is --out, never a preset key
    bad.write_text("out: elsewhere\n")
    with pytest.raises(ValueError, match="unknown keys"):
        load_config(bad)
    with pytest.raises(FileNotFoundError, match="no experiment preset 'quik'"):
        _cli(tmp_path, "--recipe", "quik")
    with pytest.raises(ValueError, match="--quick is the quick preset"):
        _cli(tmp_path, "--recipe", "fmt", "--quick")
    with pytest.raises(ValueError, match="--steps must be >= 1"):
        _cli(tmp_path, "--recipe", "quick", "--steps", "0")


def test_the_commands_bench_results_quotes_are_their_presets(tmp_path):
    """bench/RESULTS.md's run-5 command and the SmolLM2 plan's, as printed there, give the fmt and
    smollm2_plan presets."""
    run5 = "--seeds 3 --steps 40 --train-sessions 40 --heldout-sessions 12 --sft-steps 150 --pretrain-steps 500"
    run5 += " --eval-every 40 --arms start,nll,dpo,dpo_differing,dpo_first"
    assert _cli(tmp_path, *run5.split()) == load_config("fmt", tmp_path)
    plan = "--model smollm2 --seeds 3 --preference-tokens first_differing --dpo-variant dpop".split()
    assert _cli(tmp_path, *plan) == load_config("smollm2_plan", tmp_path)
