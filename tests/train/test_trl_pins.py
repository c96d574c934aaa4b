"""Pins of the TRL internals the three-channel trainer overrides and reads (composer_pipeline/train/:
trainer.py, the rollouts in generation.py, the step log in step_log.py).

``ThreeChannelTrainer`` subclasses TRL's ``GRPOTrainer`` (through ``generation.RowSeededRollouts``, which
overrides the rollouts) and overrides private methods. A TRL
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

# the trainer's own classes between it and GRPOTrainer (ThreeChannelTrainer, RowSeededRollouts)
OWN_CLASSES = ThreeChannelTrainer.__mro__[: ThreeChannelTrainer.__mro__.index(GRPOTrainer)]

# the version the pins were read from (pyproject.toml pins it too)
TRL_VERSION = "1.16.0"

# overridden method -> the parameters TRL's version must have, in order (the override's signature
# and its super() call pass them positionally); __init__: the keywords build_trainer passes
SIGNATURES = {
    "__init__": {"model", "reward_funcs", "args", "train_dataset", "processing_class", "peft_config"},
    "_generate_and_score_completions": ["self", "inputs"],
    "_get_per_token_logps_and_entropies": [
        "self",
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
        "compute_aux_loss",
    ],
    "_compute_loss": ["self", "model", "inputs"],
    # the data-parallel rollout sampler (train/generation.py): returns (completion_ids, logprobs)
    "_generate_single_turn": [
        "self",
        "prompt_ids",
        "images",
        "multimodal_fields",
        "num_generations",
        "has_tool_images",
    ],
}
# overridden method -> (TRL method that calls it, keyword arguments of that call the override reads)
CALL_POINTS = {
    "_generate_and_score_completions": [("_prepare_inputs", set())],
    "_get_per_token_logps_and_entropies": [
        ("_compute_loss", {"compute_entropy", "compute_aux_loss"}),
        ("_generate_and_score_completions", {"batch_size"}),
    ],
    "_compute_loss": [("compute_loss", set())],
    "_generate_single_turn": [("_generate", set())],
}
# keys of _generate_and_score_completions' output the overrides read
BATCH_KEYS = {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask"}
# attributes the overrides read: set in GRPOTrainer.__init__ / in transformers.Trainer
GRPO_ATTRIBUTES = [
    "temperature",
    "use_vllm",
    "use_transformers_continuous_batching",
    "generation_kwargs",
    "max_completion_length",
    "eos_token_ids",
    "_tokenizer",
    "tools",
]
TRAINER_ATTRIBUTES = ["processing_class", "accelerator", "current_gradient_accumulation_steps", "model_wrapped"]
# transformers.Trainer's public state the overrides read (self.args: the GRPOConfig fields below)
PUBLIC_ATTRIBUTES = ["args", "state"]
ARGS_FIELDS = [
    "seed",
    "ds3_gather_for_generation",
    "gradient_checkpointing_kwargs",
    "max_steps",
]  # max_steps: TAID's schedule length
# TRL helpers the rollout override (train/generation.py) calls -> the keywords it passes them
HELPER_KEYWORDS = {
    "trl.models.utils.unwrap_model_for_generation": {"gather_deepspeed3_params", "gradient_checkpointing_kwargs"},
    "trl.trainer.utils.pad": {"padding_value", "padding_side"},
}


def _trl_function(name: str) -> ast.FunctionDef:
    src = textwrap.dedent(inspect.getsource(getattr(GRPOTrainer, name)))
    return ast.parse(src).body[0]


def test_trl_version_is_the_pinned_one():
    assert trl.__version__ == TRL_VERSION, (
        f"TRL {trl.__version__} installed, the overrides in train/trainer.py were written against {TRL_VERSION}: "
        "re-read GRPOTrainer's private methods, fix the overrides, then update the pins in this file"
    )


def test_every_override_is_pinned():
    assert [c.__name__ for c in OWN_CLASSES] == ["ThreeChannelTrainer", "RowSeededRollouts"]
    overridden = {n for c in OWN_CLASSES for n, v in vars(c).items() if callable(v) and hasattr(GRPOTrainer, n)}
    assert overridden == set(SIGNATURES), (
        f"ThreeChannelTrainer and its bases override {sorted(overridden)} but this file pins {sorted(SIGNATURES)}: "
        "pin the new override's TRL signature and call points here"
    )


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_overridden_signatures(name):
    assert name in vars(GRPOTrainer) or name == "__init__", f"GRPOTrainer no longer defines {name}"
    params = list(inspect.signature(getattr(GRPOTrainer, name)).parameters)
    want = SIGNATURES[name]
    if isinstance(want, set):
        assert want <= set(params), f"GRPOTrainer.{name} lost the keywords {sorted(want - set(params))}"
        return
    assert params[: len(want)] == want, (
        f"GRPOTrainer.{name} parameters changed: TRL has {params}, the override expects {want} first"
    )
    defaults = {k: p.default for k, p in inspect.signature(getattr(GRPOTrainer, name)).parameters.items()}
    # the override forwards these defaults unchanged
    if name == "_get_per_token_logps_and_entropies":
        assert (defaults["batch_size"], defaults["compute_entropy"], defaults["compute_aux_loss"]) == (
            None,
            False,
            False,
        )


@pytest.mark.parametrize("name", sorted(CALL_POINTS))
def test_call_points(name):
    for caller, keywords in CALL_POINTS[name]:
        calls = [
            node
            for node in ast.walk(_trl_function(caller))
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == name
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"
        ]
        assert calls, f"GRPOTrainer.{caller} no longer calls self.{name}: the override would never run there"
        for call in calls:
            passed = {k.arg for k in call.keywords if k.arg}
            assert keywords <= passed, (
                f"GRPOTrainer.{caller} calls self.{name} without {sorted(keywords - passed)} (passes {sorted(passed)})"
            )


def test_get_per_token_logps_returns_three_values():
    ret = inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).return_annotation
    assert "tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]" in str(ret), (
        f"_get_per_token_logps_and_entropies now returns {ret}; the override returns (logps, entropies, None)"
    )


def test_generate_single_turn_returns_ids_and_logprobs():
    """The rollout override returns (completion_ids, None); TRL's caller must still unpack two values."""
    src = inspect.getsource(GRPOTrainer._generate)
    assert "completion_ids, logprobs = self._generate_single_turn(" in src, (
        "GRPOTrainer._generate no longer unpacks (completion_ids, logprobs) from _generate_single_turn"
    )


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


def test_rollout_helpers_take_the_keywords_the_override_passes():
    import importlib

    for path, keywords in HELPER_KEYWORDS.items():
        module, _, name = path.rpartition(".")
        params = set(inspect.signature(getattr(importlib.import_module(module), name)).parameters)
        assert keywords <= params, (
            f"{path} lost the keywords {sorted(keywords - params)} that train/generation.py passes"
        )


def test_metrics_store_holds_the_rewards_the_step_log_reads():
    """``train/step_log.py``'s ``StepLog`` reads ``trainer._metrics["train"]["reward"|"reward_std"]`` (the
    latest value): GRPOTrainer must keep that per-mode dict of lists and append both keys each generation."""
    init = inspect.getsource(GRPOTrainer.__init__)
    assert 'self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}' in init, (
        "GRPOTrainer.__init__ no longer sets self._metrics as {'train': defaultdict(list), ...}"
    )
    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for key in ("reward", "reward_std"):
        assert f'self._metrics[mode]["{key}"].append(' in src, (
            f"_generate_and_score_completions no longer appends self._metrics[mode][{key!r}]"
        )


def test_every_trl_attribute_the_overrides_read_is_pinned():
    """Every ``self.<name>`` the trainer's own classes read and do not set themselves comes from TRL or
    transformers: it must be one of the pinned attributes above (so a new private read gets a pin)."""
    reads, own = set(), set()
    args_reads = set()
    for cls in OWN_CLASSES:
        own |= set(vars(cls))
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(cls)))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                (own.add if isinstance(node.ctx, ast.Store) else reads.add)(node.attr)
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "args"
                and isinstance(node.value.value, ast.Name)
                and node.value.value.id == "self"
            ):
                args_reads.add(node.attr)
    unpinned = sorted(reads - own - set(GRPO_ATTRIBUTES) - set(TRAINER_ATTRIBUTES) - set(PUBLIC_ATTRIBUTES))
    assert not unpinned, f"the overrides read {unpinned} from TRL/transformers without a pin here"
    assert args_reads == set(ARGS_FIELDS), f"the overrides read self.args.{sorted(args_reads)}; pinned: {ARGS_FIELDS}"
    from trl import GRPOConfig

    fields = set(GRPOConfig.__dataclass_fields__)
    assert set(ARGS_FIELDS) <= fields, f"GRPOConfig lost {sorted(set(ARGS_FIELDS) - fields)}"
