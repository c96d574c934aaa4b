"""The trainer's recipe (``recipes/train.yaml``): one typed dataclass per section, and its loader.

In:  the YAML file (or a dict). Out: a :class:`TrainRecipe`; unknown keys are an error naming the
section and the known keys, so a typo never falls back to a default silently.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from composer_pipeline.train.hints import HintTemplates


@dataclass
class Weights:
    grpo: float = 1.0  # weight of the GRPO term (0 turns the channel off)
    alpha: float = 0.5  # α: weight of the hint self-distillation JSD
    beta: float = 0.5  # β: weight of the DPO term


@dataclass
class GRPOSection:
    loss_type: str = "dapo"  # any TRL GRPOConfig.loss_type: grpo, dapo, dr_grpo, bnpo, ...
    num_generations: int = 4
    prompts_per_step: int = 2
    max_completion_length: int = 32
    temperature: float = 1.0
    kl_beta: float = 0.0  # TRL's KL-to-reference coefficient inside GRPO
    rewards: list[str] = field(default_factory=lambda: ["valid_action", "known_tool", "consensus_match", "format_shaped"])
    reward_weights: list[float] | None = None


@dataclass
class SDPOSection:
    jsd_beta: float = 0.5  # generalized-JSD β: 0 forward KL(T||S), 1 reverse KL(S||T)
    temperature: float = 1.0
    hint: HintTemplates = field(default_factory=HintTemplates)


@dataclass
class DPOSection:
    variant: str = "dpo"  # dpo (sigmoid, frozen reference) | simpo (reference-free)
    beta: float = 0.1  # DPO temperature β (not the channel weight)
    label_smoothing: float = 0.0
    simpo_beta: float = 2.0
    simpo_gamma: float = 0.5
    batch_size: int = 2  # pairs per step
    max_completion_tokens: int = 64


@dataclass
class DataSection:
    max_prompt_tokens: int = 384
    heldout_fraction: float = 0.2
    include_unpaired_states: bool = True  # trace states with no pair row become GRPO/SDPO prompts too
    render_recipe: str | None = None  # YAML with a `render:` section (e.g. recipes/ingest.yaml); null = defaults


@dataclass
class LoraSection:
    enabled: bool = False
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: str | list[str] = "all-linear"


@dataclass
class OptimSection:
    steps: int = 10
    learning_rate: float = 1e-4
    gradient_accumulation_steps: int = 1
    max_grad_norm: float = 1.0
    seed: int = 0


@dataclass
class EvalSection:
    max_prompts: int = 16  # held-out prompts scored for reward
    max_new_tokens: int = 32


@dataclass
class ScheduleSection:
    cron: str = "0 3 * * *"  # when the Dagster `nightly_training` schedule retrains (read by assets/schedules.py)


@dataclass
class TrainRecipe:
    model: str | None = None  # HF name or local path; "tiny" builds the offline tiny model
    weights: Weights = field(default_factory=Weights)
    grpo: GRPOSection = field(default_factory=GRPOSection)
    sdpo: SDPOSection = field(default_factory=SDPOSection)
    dpo: DPOSection = field(default_factory=DPOSection)
    data: DataSection = field(default_factory=DataSection)
    lora: LoraSection = field(default_factory=LoraSection)
    optim: OptimSection = field(default_factory=OptimSection)
    eval: EvalSection = field(default_factory=EvalSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)

    @classmethod
    def load(cls, path: str | Path) -> "TrainRecipe":
        raw = yaml.safe_load(Path(path).read_text()) or {}
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "TrainRecipe":
        return _build(cls, raw, "train")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def validate(self) -> None:
        if self.dpo.variant not in ("dpo", "simpo"):
            raise ValueError(f"dpo.variant must be dpo or simpo, got {self.dpo.variant!r}")
        for k in ("grpo", "alpha", "beta"):
            if getattr(self.weights, k) < 0:
                raise ValueError(f"weights.{k} must be >= 0")
        if not any(getattr(self.weights, k) > 0 for k in ("grpo", "alpha", "beta")):
            raise ValueError("all channel weights are 0: nothing to train")
        if self.grpo.num_generations < 2:
            raise ValueError("grpo.num_generations must be >= 2 (group-relative advantages)")


def _build(cls, raw: Any, where: str):
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(raw).__name__}")
    if cls is HintTemplates:
        return HintTemplates.from_dict(raw)
    known = {f.name: f for f in fields(cls)}
    unknown = set(raw) - set(known)
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(known)})")
    kwargs = {}
    for name, value in raw.items():
        default = known[name].default_factory() if callable(known[name].default_factory) else None  # type: ignore[misc]
        if is_dataclass(default):
            kwargs[name] = _build(type(default), value, f"{where}.{name}")
        else:
            kwargs[name] = value
    return cls(**kwargs)

