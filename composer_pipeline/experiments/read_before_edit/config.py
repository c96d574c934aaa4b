"""The read-before-edit experiment's settings: one typed settings dataclass and its presets.

In:  a preset under ``recipes/experiments/read_before_edit/`` (by name, e.g. ``quick``, or a YAML
     file's path) read through the settings layer (:mod:`composer_pipeline.settings`: unknown keys
     named, every value type-checked), the ``--out`` directory, and explicit values that override it.
Out: an :class:`ExperimentConfig`; :meth:`ExperimentConfig.fingerprint` is what a finished cell
     depends on (a re-run with other values cannot reuse it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from composer_pipeline import settings
from composer_pipeline.experiments.sessions import HELDOUT_SEED
from composer_pipeline.settings import derived, setting

REPO = Path(__file__).resolve().parents[3]
PRESETS = REPO / "recipes" / "experiments" / "read_before_edit"

# the teachers' entries: name -> variant (rule_teacher.VARIANTS). `rule-copy` sends the same model as
# `rule`: one model asked twice, which the pair code must count once (its distinct-model rule)
TEACHERS: dict[str, str] = {
    "rule": "rule",
    "rule-copy": "rule",
    "noisy-1": "noisy-1",
    "noisy-2": "noisy-2",
    "writer": "writer",
}


@dataclass(frozen=True)
class ExperimentConfig:
    """The experiment's sizes and switches (``recipes/experiments/read_before_edit/*.yaml``); the
    defaults are the ``default`` preset."""

    # the output directory: the CLI's --out, never a recipe key
    out: Path = derived(Path("runs/rbe"))
    model: str = setting("tiny", help="the base model: tiny | local:smollm2-135m-instruct | a model path")
    seeds: int = setting(3, help="seeds per arm (each varies the start policy's fitting and every arm's training)")
    steps: int = setting(60, help="trainer steps per arm")
    train_sessions: int = setting(48, help="generated train sessions (replayed against the teachers)")
    heldout_sessions: int = setting(
        40, help="generated held-out sessions: 40 give ~80 unread and ~60 read probe states (one moves a share < 0.02)"
    )
    sft_steps: int = setting(200, help="steps fitting the start policy to the agents' own actions")
    sft_lr: float = setting(1e-3, help="learning rate of the start policy's fitting")
    prompt_tokens: int = setting(
        320,
        help="policy prompts keep their last N tokens (fitting, arms, probes): 320 keeps the request visible at "
        "every held-out state (at 160 it was cut off at 36 of 64 read states: bench/RESULTS.md)",
    )
    pretrain_sessions: int = setting(600, help="model tiny: generated pretrain-split sessions the base model reads")
    pretrain_steps: int = setting(
        2400, help="model tiny: steps training the base model from scratch (experiments/pretrain.py)"
    )
    learning_rate: float = setting(3e-4, help="the arms' learning rate")
    eval_every: int = setting(20, help="probe the held-out states every N trainer steps")
    lora: bool = setting(False, help="train LoRA adapters (r 16, alpha 32) in the arms (large models on CPU)")
    arms: tuple[str, ...] = setting(
        ("start", "grpo", "grpo_shuffled", "sdpo", "dpo", "nll", "dpo_shuffled", "all"),
        help="the arms, in this order (experiments/read_before_edit/arms.py ARMS)",
    )
    hint_teacher: Literal["initial", "current"] = setting(
        "initial",
        help="the hinted teacher of the sdpo channel: initial (the frozen start policy) | current (the policy "
        "being trained; a teacher that moves with the student let the tiny model collapse: bench/RESULTS.md)",
    )
    dpo_sft_weight: float = setting(
        1.0,
        help="RPO's NLL term on the chosen answers beside the DPO loss; 0 = plain DPO (which broke the tiny "
        "model's output format within 60 steps: the margin grew by pushing both answers down)",
    )
    preference_tokens: Literal["all", "differing", "first_differing"] | None = setting(
        None,
        help="the tokens the preference term sums in every DPO arm that does not set its own (dpo, "
        "dpo_shuffled, all): null = the train recipe's dpo.preference_tokens",
    )
    dpo_variant: Literal["dpo", "simpo", "dpop"] | None = setting(
        None,
        help="the preference loss (dpo.variant) in every arm with a live preference term that does not set its "
        "own (dpo, dpo_shuffled, all; nll and nll_all keep the recipe's): null = the train recipe's dpo.variant",
    )
    action_order: Literal["sorted", "name_first"] = setting(
        "sorted",
        help="the tool calls' key order in every completion text of the chain (render.action_order): the base "
        "model's corpus, template and windows, the start fit, the pairs, hints and GRPO targets",
    )
    max_new_tokens: int = setting(
        96, help="probes and rollouts: new tokens (a whole Edit call with the tiny tokenizer is ~80)"
    )
    probe_states: Literal["all", "decisive"] = setting(
        "all", help="all | decisive (only the decisive state kinds: cheaper for a large model)"
    )
    budget_minutes: float | None = setting(
        None, help="stop cleanly before the next cell once spent (a re-run resumes); null: no budget"
    )
    device: Literal["cpu", "cuda", "auto"] = setting(
        "cpu",
        help="where the models train and the probes generate: cpu (fp32) | cuda (fp32 weights, the trainer's "
        "bf16 autocast; fails at once where torch sees no CUDA device) | auto (cuda if torch sees one, else cpu); "
        "a run directory records a device other than cpu, so its cells do not mix with cpu ones",
    )
    only_seeds: tuple[int, ...] | None = setting(
        None,
        help="which seeds this process runs, in this order (null: 0 .. seeds-1); a second process on the same "
        "out directory over other seeds shares the finished cells (each cell is re-checked before it is run)",
    )

    def fingerprint(self) -> dict[str, Any]:
        """What a finished cell depends on: a re-run with other values cannot reuse the cells (seeds,
        arms and the budget may change: they only say which cells to run)."""
        d = {
            k: getattr(self, k)
            for k in self.__dataclass_fields__
            if k not in ("out", "seeds", "arms", "budget_minutes", "only_seeds")
        }
        # cpu cells keep the fingerprint they had before the device setting existed; cuda ones name it
        # (auto is resolved before a run: run.run_experiment)
        if d["device"] == "cpu":
            del d["device"]
        # likewise the recipe's variant (null) and sorted (the default order): run dirs made before these
        # settings stay resumable
        if d["dpo_variant"] is None:
            del d["dpo_variant"]
        if d["action_order"] == "sorted":
            del d["action_order"]
        # version 5: pairs whose chosen side repeats the prompt's last call are dropped, and every cell
        # records parse_rate and the answers' full texts (issue 31): cells of version 4 do not mix with these
        return {**d, "heldout_seed": HELDOUT_SEED, "teachers": TEACHERS, "version": 5}


def preset_path(recipe: str | Path) -> Path:
    """A preset's file: a name (``quick``) under ``recipes/experiments/read_before_edit/``, else a path."""
    named = PRESETS / f"{recipe}.yaml"
    if isinstance(recipe, str) and "/" not in recipe and not recipe.endswith((".yaml", ".yml")):
        if not named.is_file():
            known = sorted(p.stem for p in PRESETS.glob("*.yaml"))
            raise FileNotFoundError(f"no experiment preset {recipe!r}; known: {known} (or give a YAML file)")
        return named
    return Path(recipe)


def load_config(recipe: str | Path = "default", out: Path | None = None, **overrides: Any) -> ExperimentConfig:
    """The preset ``recipe`` (a name or a YAML file) with ``overrides`` on top (``None`` values are
    not given), read strictly through the settings layer; ``out`` the output directory."""
    path = preset_path(recipe)
    raw = settings.read_yaml(path, "experiment preset")
    raw.update({k: v for k, v in overrides.items() if v is not None})
    cfg = settings.from_dict(ExperimentConfig, raw, str(path))
    return cfg if out is None else replace(cfg, out=Path(out))
