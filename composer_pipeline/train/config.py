"""The trainer's recipe (``recipes/train.yaml``): one typed settings dataclass per section, and the
decision of which channels a run trains.

In:  the YAML file (or a dict). Out: a :class:`TrainRecipe`, read through
:mod:`composer_pipeline.settings` (unknown keys name the section and the allowed keys; values are
type-checked); :meth:`TrainRecipe.validate` adds the cross-field rules; :func:`grpo_config` maps it
onto TRL's ``GRPOConfig`` for one run. :func:`decide_channels`: the
recipe's weights and what the training data holds -> :class:`Channels` (which channels fire, and for
each one that does not, why), the one place that decision is made; the trainer reads it every step.

Deliberately simplified: the decision is made once per run; a channel that is on but finds no input in
one batch (SDPO without an error site) is reported off for that step by the trainer itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from composer_pipeline import settings
from composer_pipeline.settings import setting
from composer_pipeline.train import distributed


@dataclass
class Weights:
    """One weight per channel, named for the channel (``dpo.beta`` is DPO's own β, not a weight)."""

    # the names before issue 36; they still load, with a RenamedKeyWarning naming the new key
    RENAMED: ClassVar[dict[str, str]] = {"alpha": "sdpo", "beta": "dpo"}

    grpo: float = setting(1.0, help="weight of the GRPO term; 0 turns channel 1 off")
    sdpo: float = setting(
        0.5, help="weight of the hint self-distillation divergence at error sites (was `alpha`); 0 turns channel 2 off"
    )
    dpo: float = setting(0.5, help="weight of the DPO term on normalized pairs (was `beta`); 0 turns channel 3 off")


@dataclass
class GRPOSection:
    loss_type: str = setting("dapo", help="any TRL GRPOConfig.loss_type: grpo, dapo, dr_grpo, bnpo, ...")
    num_generations: int = setting(4, help="rollouts per prompt (group size for the advantage), >= 2")
    prompts_per_step: int = setting(2, help="distinct trace states per step (batch = prompts × generations)")
    max_completion_length: int = setting(32, help="tokens generated per rollout")
    temperature: float = setting(1.0, help="sampling temperature of the rollouts")
    kl_beta: float = setting(0.0, help="TRL's KL-to-reference coefficient inside GRPO (0: no reference forward)")
    rewards: list[str] = setting(
        factory=lambda: ["valid_action", "known_tool", "consensus_match", "format_shaped"],
        help="reward functions by name (composer_pipeline.train.rewards.REWARDS; add yours there)",
    )
    reward_weights: list[float] | None = setting(None, help="one float per reward; null = all 1.0")
    data_order: Literal["error_sites_first", "shuffled"] = setting(
        "error_sites_first",
        help="order of the GRPO prompts (TRL does not reshuffle them): error_sites_first (each "
        "step's block holds an error site when possible, so the hint channel has inputs) | shuffled (a seeded shuffle: "
        "the control for what that order alone does)",
    )


@dataclass
class TaidSection:
    t_start: float = setting(0.4, help="TAID's interpolation t at the first step (arXiv 2501.16937)")
    t_end: float = setting(1.0, help="t never exceeds this; the linear floor reaches it at the last step")
    alpha: float = setting(5e-4, help="TAID's adaptive step size α")
    beta: float = setting(0.99, help="TAID's momentum β over the relative loss change")
    adaptive: bool = setting(True, help="false: t follows the linear floor alone")


@dataclass
class EOPDSection:
    entropy_threshold: float = setting(
        1.0,
        help="teacher token entropy (nats, after temperature) above which the forward KL is added (our choice: "
        "the paper's exact gate could not be read here)",
    )
    forward_weight: float = setting(1.0, help="weight of the forward KL(teacher‖student) at gated tokens")


@dataclass(frozen=True)
class HintTemplates:
    """The ``sdpo.hint`` section of ``recipes/train.yaml``."""

    with_consensus: str = setting(
        "Hint: the step `{agent}` failed with: {error}\nA better next step: {consensus}",
        help="hint when teachers agreed on a different step",
    )
    without_consensus: str = setting(
        "Hint: the step `{agent}` failed with: {error}\nTake a different next step.",
        help="hint when there is no teacher consensus",
    )
    role: str = setting("user", help="role of the hint message inserted before the generation point")
    max_error_chars: int = setting(300, help="the error text is clipped to this many characters")
    max_action_chars: int = setting(200, help="actions in the hint are clipped to this many characters")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> HintTemplates:
        return settings.from_dict(cls, d, "train recipe", "sdpo.hint")


@dataclass
class SDPOSection:
    divergence: Literal["jsd", "taid", "eopd"] = setting(
        "jsd",
        help="jsd (generalized JSD, jsd_beta) | taid (cross-entropy to TAID's interpolated target, sdpo.taid) | "
        "eopd (reverse KL + forward KL where the teacher's entropy is high, sdpo.eopd)",
    )
    jsd_beta: float = setting(
        0.5, help="generalized-JSD β: 0 forward KL(teacher‖student), 1 reverse KL(student‖teacher)"
    )
    temperature: float = setting(1.0, help="softmax temperature for both distributions")
    teacher: Literal["current", "initial"] = setting(
        "initial",
        help="the hinted teacher: current (the policy being trained, SDPO's self-teacher) | initial (a frozen "
        "copy of the starting policy, OPSD's step-0 teacher; with LoRA the adapters disabled): it cannot drift with the "
        "student, so the two cannot meet at ignoring the hint",
    )
    hint: HintTemplates = setting(
        factory=HintTemplates, help="corrective hint templates; fields {agent} {error} {consensus}"
    )
    taid: TaidSection = setting(factory=TaidSection, help="TAID schedule (divergence: taid)")
    eopd: EOPDSection = setting(factory=EOPDSection, help="entropy-aware OPD gate (divergence: eopd)")


@dataclass
class DPOSection:
    variant: Literal["dpo", "simpo", "dpop"] = setting(
        "dpop",
        help="dpo (sigmoid loss, frozen copy of the starting policy as reference) | simpo (reference-free) | "
        "dpop (DPO-Positive, Pal et al. 2024, arXiv 2402.13228 eq. 3: the DPO logit less dpop_lambda · "
        "max(0, log π_ref(chosen) − log π(chosen)), so the chosen answer cannot fall below the reference). "
        "The default, with preference_tokens first_differing and sft_weight 1, is the pre-registered SmolLM2 "
        "table's preference arm: held-out parse rate 0.982 over 3 seeds (bench/RESULTS.md)",
    )
    beta: float = setting(0.1, help="DPO β (inverse temperature of the implicit reward; not the channel weight)")
    label_smoothing: float = setting(0.0, help="cDPO ε; 0 = plain DPO (first-step loss is exactly ln 2)")
    dpop_lambda: float = setting(
        50.0,
        help="DPOP λ (variant: dpop), the penalty's weight inside the sigmoid; the paper's 50 (its authors found "
        "5–500 to give similar results). The penalty reads every chosen token, whatever preference_tokens says",
    )
    simpo_beta: float = setting(2.0, help="SimPO β (variant: simpo)")
    simpo_gamma: float = setting(0.5, help="SimPO target margin γ (variant: simpo)")
    sft_weight: float = setting(
        1.0,
        help="weight of a negative log-likelihood term on the chosen completions (token mean), added to the "
        "preference loss: TRL's DPOConfig loss_type ['sigmoid', 'sft'] with loss_weights [1, w] (RPO, Pang et al. 2024, "
        "arXiv:2404.19733); keeps the chosen answers likely while the margin grows. 0 = off",
    )
    preference_tokens: Literal["all", "differing", "first_differing"] = setting(
        "first_differing",
        help="which completion tokens the preference term sums: all | differing (from the first token where "
        "chosen and rejected differ to their common ending, so the margin never pushes down the closing "
        "structure both answers share) | first_differing (only that first differing token: the decision, "
        "nothing after it); the NLL term still reads every chosen token",
    )
    batch_size: int = setting(2, help="pairs per step")
    max_completion_tokens: int = setting(64, help="chosen/rejected answers keep their first N tokens")
    data_order: Literal["shuffled", "table"] = setting(
        "shuffled",
        help="order of the pairs: shuffled (a seeded shuffle by optim.seed, and the batches reshuffled on every "
        "later pass, so a run shorter than one pass samples the whole table) | table (the pairs table's order, "
        "cycled: a run shorter than one pass reads only the table's first rows)",
    )


@dataclass
class DataSection:
    max_prompt_tokens: int = setting(384, help="prompts keep their last N tokens")
    heldout_fraction: float = setting(0.2, help="sha256(state_id) split; held-out states feed `train eval`")
    include_unpaired_states: bool = setting(
        True, help="trace states with no pair row (no replay yet) become GRPO/SDPO prompts too"
    )
    render_recipe: str | None = setting(
        None, help="YAML with a `render:` section (e.g. recipes/ingest.yaml); null = render defaults"
    )


@dataclass
class LoraSection:
    enabled: bool = setting(False, help="train LoRA adapters (reference = adapters disabled), merged on save")
    r: int = setting(8, help="LoRA rank")
    alpha: int = setting(16, help="LoRA alpha")
    dropout: float = setting(0.0, help="LoRA dropout")
    target_modules: str | list[str] = setting("all-linear", help="peft target_modules: a name pattern or a list")


@dataclass
class OptimSection:
    steps: int = setting(10, help="optimizer steps (`composer-pipeline train --steps` overrides)")
    learning_rate: float = setting(1e-4, help="constant learning rate")
    gradient_accumulation_steps: int = setting(1, help="micro-batches per optimizer step")
    max_grad_norm: float = setting(1.0, help="gradient clipping norm")
    seed: int = setting(0, help="seed of the data order, the rollouts and the held-out probe")


@dataclass
class EvalSection:
    max_prompts: int = setting(16, help="held-out prompts scored for reward / hint-JSD")
    max_new_tokens: int = setting(32, help="tokens generated per held-out prompt")
    min_rows_to_measure: int = setting(
        30,
        help="held-out rows (pairs or prompts) below which an evaluation measures nothing: the no_regression "
        "check states that verdict (not a failure, not a pass on the numbers), and the demo prints that its "
        "training is a smoke run",
    )


@dataclass
class ScheduleSection:
    cron: str = setting(
        "0 3 * * *",
        help="when the Dagster `nightly_training` schedule retrains (UTC); the one home of the training cron",
    )


@dataclass
class DiLoCoSection:
    """The recipe's ``diloco:`` section: training across replica groups that sync every H steps (DiLoCo);
    ``replica_groups: 1`` = off, the plain one-process / DDP trainer.

    Sign convention (DiLoCo, Douillard et al. 2023, arXiv:2311.08455, Algorithm 1): every ``inner_steps``
    (H) optimizer steps each live group computes its *pseudo-gradient* ``Δ_g = θ_before − θ_after`` (the
    global parameters at the last sync minus this group's parameters after its H inner steps: it points
    where a gradient points, uphill); the groups' mean ``Δ = mean_g Δ_g`` over the groups live in that
    outer step is fed to the outer optimizer as the gradient of ``θ_before``: with Nesterov SGD
    ``b ← μ·b + Δ``, ``θ ← θ_before − lr·(Δ + μ·b)``. With ``outer_lr: 1`` and no momentum the outer
    step is ``θ_before − Δ``: the mean of the groups' parameters (model averaging).

    Deliberately simplified: one fragment (the whole model syncs at once, no Streaming DiLoCo); the
    pseudo-gradients travel at full precision.
    """

    replica_groups: int = setting(
        1, help="replica groups training one model (DiLoCo through torchft); 1 = off (one process or DDP ranks)"
    )
    inner_steps: int = setting(
        5, help="H: optimizer steps each group takes on its own shard between two syncs (the paper uses 500)"
    )
    outer_lr: float = setting(0.7, help="outer optimizer learning rate (DiLoCo paper, arXiv:2311.08455: 0.7)")
    outer_momentum: float = setting(0.9, help="outer SGD momentum μ (paper: 0.9); 0 = plain SGD")
    nesterov: bool = setting(True, help="Nesterov momentum in the outer SGD (paper: true)")
    lighthouse: str | None = setting(
        None,
        help="many hosts: the torchft lighthouse address (http://HOST:PORT) this host's group joins; "
        "null = `composer-pipeline train` starts one lighthouse and every group on this machine",
    )
    group: int | None = setting(
        None, help="many hosts: this host's group id, 0 .. replica_groups-1 (`train --group` overrides)"
    )
    rejoin_timeout_s: float = setting(
        120.0,
        help="a lost group restarted by the launching command must rejoin within this many seconds, else it is "
        "dropped (logged with the reason) and the others go on; also how long a sync waits for a heartbeating straggler",
    )
    max_restarts: int = setting(2, help="restarts per group before it is dropped (one machine)")
    timeout_s: float = setting(
        30.0, help="torchft timeout of one collective / commit: how long a sync waits on a peer that stopped answering"
    )

    def __post_init__(self) -> None:
        if self.replica_groups < 1:
            raise ValueError(f"diloco.replica_groups must be >= 1, got {self.replica_groups}")
        if self.inner_steps < 1:
            raise ValueError(f"diloco.inner_steps must be >= 1, got {self.inner_steps}")
        if self.outer_lr <= 0 or not 0 <= self.outer_momentum < 1:
            raise ValueError("diloco.outer_lr must be > 0 and diloco.outer_momentum in [0, 1)")
        if self.nesterov and self.outer_momentum == 0:
            raise ValueError("diloco.nesterov needs diloco.outer_momentum > 0 (torch's SGD refuses it)")
        if self.group is not None and not 0 <= self.group < self.replica_groups:
            raise ValueError(f"diloco.group must be in 0..{self.replica_groups - 1}, got {self.group}")

    @property
    def enabled(self) -> bool:
        return self.replica_groups > 1

    def outer_steps(self, steps: int) -> int:
        """Outer steps in a run of ``steps`` inner steps per group (``steps`` must be a multiple of H)."""
        if steps % self.inner_steps:
            raise ValueError(
                f"optim.steps = {steps} is not a multiple of diloco.inner_steps = {self.inner_steps}: "
                "every group must end on a sync"
            )
        return steps // self.inner_steps


@dataclass
class TrainRecipe:
    model: str | None = setting(
        None, help='HF model name, local path, "tiny" or "local:smollm2-135m-instruct" (`--model` overrides)'
    )
    weights: Weights = setting(factory=Weights, help="channel weights: total = grpo·GRPO + sdpo·SDPO + dpo·DPO")
    grpo: GRPOSection = setting(factory=GRPOSection, help="channel 1: GRPO with verifiable rewards (TRL)")
    sdpo: SDPOSection = setting(factory=SDPOSection, help="channel 2: hint self-distillation at error sites")
    dpo: DPOSection = setting(factory=DPOSection, help="channel 3: DPO, DPOP or SimPO on the normalized pairs")
    data: DataSection = setting(factory=DataSection, help="prompts, held-out split, rendering")
    lora: LoraSection = setting(factory=LoraSection, help="LoRA adapters (off: full fine-tuning)")
    optim: OptimSection = setting(factory=OptimSection, help="optimizer and steps")
    eval: EvalSection = setting(factory=EvalSection, help="held-out evaluation (`train eval`, `policy_eval`)")
    schedule: ScheduleSection = setting(factory=ScheduleSection, help="nightly retraining")
    diloco: DiLoCoSection = setting(
        factory=DiLoCoSection, help="replica groups syncing every H steps (DiLoCo on torchft); replica_groups 1 = off"
    )

    @classmethod
    def load(cls, path: str | Path | None = None) -> TrainRecipe:
        """Read a train recipe; ``None`` (pipeline.yaml names no train recipe file) means the defaults, as
        for the ingest recipe and the training schedule."""
        if path is None:
            return cls()
        return settings.load(cls, path, "train recipe")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainRecipe:
        return settings.from_dict(cls, raw, "train recipe")

    def to_dict(self) -> dict[str, Any]:
        return settings.to_dict(self)

    def validate(self) -> None:
        if self.dpo.variant not in ("dpo", "simpo", "dpop"):
            raise ValueError(f"dpo.variant must be dpo, simpo or dpop, got {self.dpo.variant!r}")
        if self.dpo.dpop_lambda < 0:
            raise ValueError(f"dpo.dpop_lambda must be >= 0, got {self.dpo.dpop_lambda}")
        for k in CHANNELS:
            if getattr(self.weights, k) < 0:
                raise ValueError(f"weights.{k} must be >= 0")
        if not any(getattr(self.weights, k) > 0 for k in CHANNELS):
            raise ValueError("all channel weights are 0: nothing to train")
        if self.dpo.preference_tokens not in ("all", "differing", "first_differing"):
            raise ValueError(
                f"dpo.preference_tokens must be all, differing or first_differing, got {self.dpo.preference_tokens!r}"
            )
        if self.grpo.data_order not in ("error_sites_first", "shuffled"):
            raise ValueError(f"grpo.data_order must be error_sites_first or shuffled, got {self.grpo.data_order!r}")
        if self.sdpo.divergence not in ("jsd", "taid", "eopd"):
            raise ValueError(f"sdpo.divergence must be jsd, taid or eopd, got {self.sdpo.divergence!r}")
        if not 0.0 <= self.sdpo.taid.t_start <= self.sdpo.taid.t_end <= 1.0:
            raise ValueError("sdpo.taid needs 0 <= t_start <= t_end <= 1")
        if self.grpo.num_generations < 2:
            raise ValueError("grpo.num_generations must be >= 2 (group-relative advantages)")


def grpo_config(recipe: TrainRecipe, *, out_dir: Path, steps: int, world: int, cuda: bool):
    """TRL's ``GRPOConfig`` for a run of ``steps`` on ``world`` ranks (the global batch split over them);
    TRL's own checkpoints, logging and progress bars off (:mod:`.checkpoints` and :mod:`.step_log` do it)."""
    from trl import GRPOConfig

    g = recipe.grpo
    return GRPOConfig(
        output_dir=str(out_dir / "trainer"),
        max_steps=steps,
        per_device_train_batch_size=distributed.per_rank_rows(
            g.prompts_per_step * g.num_generations, world, "grpo.prompts_per_step × grpo.num_generations"
        ),
        num_generations=g.num_generations,
        max_completion_length=g.max_completion_length,
        temperature=g.temperature,
        loss_type=g.loss_type,
        beta=g.kl_beta,
        reward_weights=g.reward_weights,
        learning_rate=recipe.optim.learning_rate,
        lr_scheduler_type="constant",
        gradient_accumulation_steps=recipe.optim.gradient_accumulation_steps,
        max_grad_norm=recipe.optim.max_grad_norm,
        seed=recipe.optim.seed,
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        bf16=cuda,
        use_cpu=not cuda,
        dataloader_pin_memory=False,
        disable_tqdm=True,
    )


# -- which channels train ------------------------------------------------------------------------
CHANNELS = ("grpo", "sdpo", "dpo")


@dataclass(frozen=True)
class Channels:
    """Which channels fire in a run and why the others do not. An off channel is logged ``null`` with
    its reason every step (``off_reasons``), never as a silent 0."""

    weights: Weights
    off_reasons: dict[str, str]

    def on(self, ch: str) -> bool:
        return ch not in self.off_reasons

    def weight(self, ch: str) -> float:
        return getattr(self.weights, ch)

    @property
    def reads_rollouts(self) -> bool:
        """GRPO scores the sampled completions and SDPO distils on them; DPO alone never reads one."""
        return self.on("grpo") or self.on("sdpo")


def decide_channels(weights: Weights, *, has_error_sites: bool, has_pairs: bool) -> Channels:
    """A channel is off when its weight is 0 or when the training data has nothing it could train on
    (SDPO: no prompt with a hint, i.e. no error site; DPO: no pair). Every channel off is an error."""
    off: dict[str, str] = {}
    if weights.grpo == 0:
        off["grpo"] = "weight 0"
    if weights.sdpo == 0:
        off["sdpo"] = "weight 0"
    elif not has_error_sites:
        off["sdpo"] = "no error sites in the training data"
    if weights.dpo == 0:
        off["dpo"] = "weight 0"
    elif not has_pairs:
        off["dpo"] = "no DPO pairs in the training data"
    if len(off) == len(CHANNELS):
        raise ValueError(f"every channel is off: {off}")
    return Channels(weights=weights, off_reasons=off)
