"""Pins of the TRL internals the three-channel trainer (composer_pipeline/train/trainer.py) overrides.

``ThreeChannelTrainer`` subclasses TRL's ``GRPOTrainer`` and overrides private methods. A TRL
upgrade can rename them, change their parameters, or stop calling them from where the overrides
expect, and the trainer would silently train something else. Each check below fails with a message
naming the method and what changed; after reading the new TRL code, update the override and the pin
together. Checked on the installed TRL, from its source (no model is built).
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
import trl
from trl import GRPOTrainer

from composer_pipeline.train.trainer import ThreeChannelTrainer

TRL_VERSION = "1.16.0"  # the version the pins were read from (pyproject.toml pins it too)

# overridden method -> the parameters TRL's version must have, in order (the override's signature
# and its super() call pass them positionally); __init__: the keywords build_trainer passes
SIGNATURES = {
    "__init__": {"model", "reward_funcs", "args", "train_dataset", "processing_class", "peft_config"},
    "_generate_and_score_completions": ["self", "inputs"],
    "_get_per_token_logps_and_entropies": ["self", "model", "input_ids", "attention_mask", "logits_to_keep",
                                           "batch_size", "compute_entropy", "compute_aux_loss"],
    "_compute_loss": ["self", "model", "inputs"],
    # the data-parallel rollout sampler (train/distributed.py): returns (completion_ids, logprobs)
    "_generate_single_turn": ["self", "prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"],
}
# overridden method -> (TRL method that calls it, keyword arguments of that call the override reads)
CALL_POINTS = {
    "_generate_and_score_completions": [("_prepare_inputs", set())],
    "_get_per_token_logps_and_entropies": [("_compute_loss", {"compute_entropy", "compute_aux_loss"}),
                                           ("_generate_and_score_completions", {"batch_size"})],
    "_compute_loss": [("compute_loss", set())],
    "_generate_single_turn": [("_generate", set())],
}
# keys of _generate_and_score_completions' output the overrides read
BATCH_KEYS = {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask"}
# attributes the overrides read: set in GRPOTrainer.__init__ / in transformers.Trainer
GRPO_ATTRIBUTES = ["temperature", "use_vllm", "use_transformers_continuous_batching", "generation_kwargs",
                   "max_completion_length", "eos_token_ids", "_tokenizer"]
TRAINER_ATTRIBUTES = ["processing_class", "accelerator", "current_gradient_accumulation_steps"]


def _trl_function(name: str) -> ast.FunctionDef:
    src = textwrap.dedent(inspect.getsource(getattr(GRPOTrainer, name)))
    return ast.parse(src).body[0]


def test_trl_version_is_the_pinned_one():
    assert trl.__version__ == TRL_VERSION, (
        f"TRL {trl.__version__} installed, the overrides in train/trainer.py were written against {TRL_VERSION}: "
        "re-read GRPOTrainer's private methods, fix the overrides, then update the pins in this file")


def test_every_override_is_pinned():
    overridden = {n for n, v in vars(ThreeChannelTrainer).items() if callable(v) and hasattr(GRPOTrainer, n)}
    assert overridden == set(SIGNATURES), (
        f"ThreeChannelTrainer overrides {sorted(overridden)} but this file pins {sorted(SIGNATURES)}: "
        "pin the new override's TRL signature and call points here")


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_overridden_signatures(name):
    assert name in vars(GRPOTrainer) or name == "__init__", f"GRPOTrainer no longer defines {name}"
    params = list(inspect.signature(getattr(GRPOTrainer, name)).parameters)
    want = SIGNATURES[name]
    if isinstance(want, set):
        assert want <= set(params), f"GRPOTrainer.{name} lost the keywords {sorted(want - set(params))}"
        return
    assert params[: len(want)] == want, (
        f"GRPOTrainer.{name} parameters changed: TRL has {params}, the override expects {want} first")
    defaults = {k: p.default for k, p in inspect.signature(getattr(GRPOTrainer, name)).parameters.items()}
    if name == "_get_per_token_logps_and_entropies":  # the override forwards these defaults unchanged
        assert (defaults["batch_size"], defaults["compute_entropy"], defaults["compute_aux_loss"]) == (None, False, False)


@pytest.mark.parametrize("name", sorted(CALL_POINTS))
def test_call_points(name):
    for caller, keywords in CALL_POINTS[name]:
        calls = [node for node in ast.walk(_trl_function(caller)) if isinstance(node, ast.Call)
                 and isinstance(node.func, ast.Attribute) and node.func.attr == name
                 and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"]
        assert calls, f"GRPOTrainer.{caller} no longer calls self.{name}: the override would never run there"
        for call in calls:
            passed = {k.arg for k in call.keywords if k.arg}
            assert keywords <= passed, (
                f"GRPOTrainer.{caller} calls self.{name} without {sorted(keywords - passed)} (passes {sorted(passed)})")


def test_get_per_token_logps_returns_three_values():
    ret = inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).return_annotation
    assert "tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]" in str(ret), (
        f"_get_per_token_logps_and_entropies now returns {ret}; the override returns (logps, entropies, None)")


def test_generate_single_turn_returns_ids_and_logprobs():
    """The rollout override returns (completion_ids, None); TRL's caller must still unpack two values."""
    src = inspect.getsource(GRPOTrainer._generate)
    assert "completion_ids, logprobs = self._generate_single_turn(" in src, (
        "GRPOTrainer._generate no longer unpacks (completion_ids, logprobs) from _generate_single_turn")


def test_generation_batch_keys_and_attributes():
    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    missing = sorted(k for k in BATCH_KEYS if f'"{k}"' not in src)
    assert not missing, f"_generate_and_score_completions no longer outputs {missing}"
    from transformers import Trainer

    init, trainer = inspect.getsource(GRPOTrainer.__init__), inspect.getsource(Trainer)
    for attr in GRPO_ATTRIBUTES:
        assert f"self.{attr} =" in init, f"GRPOTrainer.__init__ no longer sets self.{attr}"
    for attr in TRAINER_ATTRIBUTES:
        assert f"self.{attr} =" in trainer, f"transformers.Trainer no longer sets self.{attr}"


def test_metrics_store_holds_the_rewards_the_step_log_reads():
    """``train/trainer.py``'s step record reads ``trainer._metrics["train"]["reward"|"reward_std"]`` (the
    latest value): GRPOTrainer must keep that per-mode dict of lists and append both keys each generation."""
    init = inspect.getsource(GRPOTrainer.__init__)
    assert 'self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}' in init, (
        "GRPOTrainer.__init__ no longer sets self._metrics as {'train': defaultdict(list), ...}")
    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for key in ("reward", "reward_std"):
        assert f'self._metrics[mode]["{key}"].append(' in src, (
            f"_generate_and_score_completions no longer appends self._metrics[mode][{key!r}]")
