"""The three-channel trainer: ``total = w_grpo·GRPO + w_sdpo·SDPO(hint JSD) + w_dpo·DPO`` (``weights.{grpo,sdpo,dpo}``) on any HF causal LM.

In:  a Store root with the pipeline's tables (see :mod:`composer_pipeline.train.data`), a
     :class:`~.config.TrainRecipe` (``recipes/train.yaml``), a model name/path (or ``tiny``), ``out_dir``.
Out: (through :func:`.run.train`) a :class:`~.run.TrainResult`: a checkpoint dir (safetensors + tokenizer + ``train.yaml`` +
     ``metrics.json`` + ``losses.jsonl`` + one loss-curve PNG per channel), per-step losses.

Channels, all inside one TRL ``GRPOTrainer`` step (the subclass overrides ``_compute_loss``):

1. **GRPO** with verifiable rewards (:mod:`.rewards`) on real rollouts; TRL's ``loss_type``.
2. **SDPO** hint self-distillation at error sites: the teacher is the same model, under no-grad,
   with a corrective hint (:mod:`.hints`) inserted in its context; the student is the policy
   without it. ``sdpo.teacher`` picks which weights teach: ``current`` (the policy being trained,
   SDPO's self-teacher) or ``initial`` (a frozen copy of the starting policy, OPSD's step-0 teacher:
   it cannot drift with the student, so teacher and student cannot meet at ignoring the hint).
   ``sdpo.divergence`` picks the loss: generalized JSD (:func:`.losses.generalized_jsd`), TAID
   (:func:`.losses.taid_loss`, its t moved after each step by :class:`.losses.TaidSchedule`) or
   entropy-aware OPD (:func:`.losses.entropy_aware_kl`), over the tokens of the targeted message only
   (the completion span of error-site rows). The student logits are the ones of the
   GRPO forward (captured, not recomputed), so the channel costs one extra no-grad forward.
   Added to the objective (not blended as ``trl.experimental.sdpo`` does).
3. **DPO** on the normalized pairs against a frozen copy of the starting policy (reference log-probs
   computed every step, never cached constants; with LoRA the reference is the adapter-disabled
   base), **DPOP** (DPO-Positive: the logit less ``dpo.dpop_lambda`` · how far the chosen answer fell below the
   reference, logged as ``dpo_dpop``) or **SimPO** (reference-free) as a switch; ``dpo.sft_weight`` adds RPO's NLL on the chosen
   answers (a token mean over the whole batch, under DDP too). ``dpo.preference_tokens`` picks the tokens the
   preference term sums (policy and reference alike): every completion token, the span where chosen and
   rejected differ, or the first differing token only (:func:`.losses.differing_token_masks`).

Each step's per-channel losses are logged (:mod:`.step_log`); a channel with weight 0 or with no
inputs in the data (:func:`.config.decide_channels`) or in this batch (``_compute_loss``) is reported
in ``off`` with its reason (its value is ``null``, never a silent 0).

Data-parallel under torchrun/accelerate (:mod:`.distributed`: N ranks train one model on N shards;
rank 0 writes the checkpoint). The DPO batches are the pairs in a seeded random order, reshuffled on every
later pass (``dpo.data_order``; ``table`` keeps the table's order). Deliberately simplified: no
DeepSpeed/FSDP; no EMA teacher (SDPO's regularized teacher) between the two.

The package is split the way TRL's is: the recipe, its ``GRPOConfig`` and the channel decision in
:mod:`.config`, model loading in :mod:`.modeling`, data and tokenization in :mod:`.data`, loss math in
:mod:`.losses`, the rollouts in :mod:`.generation`, the step log in :mod:`.step_log`, the checkpoint in
:mod:`.checkpoints`, building and running it (``train``, ``build_trainer``) in :mod:`.run`; here the loss
composition.
"""

from __future__ import annotations

from typing import Any

import torch

from composer_pipeline.train import distributed
from composer_pipeline.train.config import Channels, TrainRecipe
from composer_pipeline.train.data import dpo_batch_order
from composer_pipeline.train.generation import RowSeededRollouts
from composer_pipeline.train.losses import (
    TaidSchedule,
    chosen_nll,
    completion_logits,
    completion_token_logps,
    differing_token_masks,
    dpo_sigmoid_loss,
    dpop_penalty,
    entropy_aware_kl,
    generalized_jsd,
    last_token_logits,
    simpo_loss,
    taid_loss,
)
from composer_pipeline.train.step_log import reduce_over_ranks


# -- the trainer -------------------------------------------------------------------------------
class ThreeChannelTrainer(RowSeededRollouts):
    """TRL's GRPOTrainer plus the SDPO and DPO channels, added in ``_compute_loss`` (rollouts from
    :class:`.generation.RowSeededRollouts`). Every TRL method overridden here or there is pinned
    (signature, call points) by ``tests/train/test_trl_pins.py``."""

    def __init__(self, *args, channels: Channels, recipe: TrainRecipe, dpo_batches: list[dict], start_copy, **kw):
        super().__init__(*args, **kw)
        self.channels = channels
        self.recipe = recipe
        self.dpo_batches = dpo_batches
        self._dpo_i = 0
        self._dpo_order: tuple[int, list[int]] = (-1, [])
        # which batches the run reached (TrainResult.metrics data.pairs_reached)
        self.dpo_batches_seen: set[int] = set()
        # frozen copy of the starting policy: DPO's reference and the `initial` hint teacher (None with
        # LoRA, where the adapters disabled are the starting policy, or when neither needs it)
        self.start_copy = start_copy.to(self.accelerator.device) if start_copy is not None else None
        self._capture = False
        self._captured_logits: torch.Tensor | None = None
        self.pending: list[dict[str, Any]] = []
        self.batch_states: list[str] = []
        self.rank = distributed.current()
        taid = recipe.sdpo.taid
        self.taid = (
            TaidSchedule(taid.t_start, taid.t_end, taid.alpha, taid.beta, self.args.max_steps, taid.adaptive)
            if recipe.sdpo.divergence == "taid"
            else None
        )

    # with GRPO and SDPO both off no loss reads a rollout: one eos per prompt instead of sampling
    # (the DPO-only arms; their losses are the same either way, tests/train/test_trainer.py)
    skip_unread_rollouts = True

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if self.skip_unread_rollouts and not self.channels.reads_rollouts:
            return [[self.eos_token_ids[0]] for _ in prompt_ids], None
        return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)

    # hint contexts ride along with the generation batch (split/shuffled with it by TRL)
    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.batch_states = distributed.union_over_ranks([x["state_id"] for x in inputs])
        hints = [x.get("hint_prompt") or "" for x in inputs]
        device = out["prompt_ids"].device
        has_hint = torch.tensor([bool(h) for h in hints], device=device)
        out["has_hint"] = has_hint
        if self.channels.on("sdpo") and bool(has_hint.any()):
            texts = [h or x["prompt"] for h, x in zip(hints, inputs)]
            # the text tokenizer (GRPOTrainer's: the processing class, or a processor's tokenizer)
            ids = self._tokenizer(text=texts)["input_ids"]
            width = max(len(i) for i in ids)
            pad = self._tokenizer.pad_token_id
            out["hint_ids"] = torch.tensor([[pad] * (width - len(i)) + i for i in ids], device=device)
            out["hint_mask"] = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids], device=device)
        return out

    # with SDPO on, the GRPO forward also hands back its completion logits (student = policy)
    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **kwargs,
    ):
        if not self._capture:
            return super()._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size,
                compute_entropy,
                compute_aux_loss,
                **kwargs,
            )
        with self.accelerator.autocast():
            logits = last_token_logits(model, input_ids, attention_mask, logits_to_keep)
        self._captured_logits = logits
        logp_all = torch.log_softmax(logits.float() / self.temperature, dim=-1)
        completion_ids = input_ids[:, -logits_to_keep:]
        logps = logp_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
        entropies = -(logp_all.exp() * logp_all).sum(-1) if compute_entropy else None
        return logps, entropies, None

    def _next_dpo_batch(self):
        epoch, pos = divmod(self._dpo_i, len(self.dpo_batches))
        if self._dpo_order[0] != epoch:
            order = dpo_batch_order(len(self.dpo_batches), epoch, self.recipe.optim.seed, self.recipe.dpo.data_order)
            self._dpo_order = (epoch, order)
        self.dpo_batch_index = self._dpo_order[1][pos]
        self.dpo_batches_seen.add(self.dpo_batch_index)
        b = self.dpo_batches[self.dpo_batch_index]
        self._dpo_i += 1
        dev = self.accelerator.device
        return {k: v.to(dev) for k, v in b.items()}

    def _dpo_loss(self, model):
        r = self.recipe.dpo
        b = self._next_dpo_batch()
        args = (b["prompt_ids"], b["prompt_mask"], b["completion_ids"], b["completion_mask"])
        n = b["prompt_ids"].size(0) // 2
        mask = b["completion_mask"]
        # DPOP's max(0, log π_ref(chosen) − log π(chosen)), mean over the batch's pairs
        penalty = None
        # the tokens the preference term reads: every completion token, or only where the sides differ
        span = (
            mask
            if r.preference_tokens == "all"
            else torch.cat(
                differing_token_masks(b["completion_ids"], mask, n, first_only=r.preference_tokens == "first_differing")
            )
        )
        with self.accelerator.autocast():
            tok_lp = completion_token_logps(model, *args)
            pol = (tok_lp * span).sum(-1)
            if r.variant == "simpo":
                avg = pol / span.sum(-1).clamp_min(1)
                loss, margins = simpo_loss(avg[:n], avg[n:], beta=r.simpo_beta, gamma=r.simpo_gamma)
            else:
                with torch.no_grad():
                    ref_tok = self._at_start(model, completion_token_logps, *args)
                ref = (ref_tok * span).sum(-1)
                # DPOP: the chosen answers' whole log-probs (every token, whatever the span)
                whole = (tok_lp[:n].sum(-1), ref_tok[:n].sum(-1))
                dpop_lambda = r.dpop_lambda if r.variant == "dpop" else 0.0
                loss, margins = dpo_sigmoid_loss(
                    pol[:n],
                    pol[n:],
                    ref[:n],
                    ref[n:],
                    beta=r.beta,
                    label_smoothing=r.label_smoothing,
                    dpop_lambda=dpop_lambda,
                    penalty_chosen=whole,
                )
                if r.variant == "dpop":
                    penalty = dpop_penalty(*whole).detach().mean()
        nll = chosen_nll(tok_lp[:n], mask[:n]) if r.sft_weight else None
        if nll is not None and self.rank.distributed:
            local = mask[:n].sum()
            nll = distributed.share_of_global_mean(nll, local, distributed.all_reduce_sum([local])[0], self.rank.world)
        if nll is not None:
            loss = loss + r.sft_weight * nll
        return loss, margins, nll, penalty

    def _at_start(self, model, fn, *args):
        """``fn(starting policy, *args)``: the frozen copy, or with LoRA the model with its adapters disabled."""
        if self.start_copy is not None:
            return fn(self.start_copy, *args)
        with self.accelerator.unwrap_model(model).disable_adapter():
            return fn(model, *args)

    def _hint_teacher_logits(self, model, hint_ids, hint_mask, c_ids, c_mask):
        """The hinted teacher's logits on the student's completion tokens (no grad)."""
        if self.recipe.sdpo.teacher == "initial":
            return self._at_start(model, completion_logits, hint_ids, hint_mask, c_ids, c_mask)
        return completion_logits(model, hint_ids, hint_mask, c_ids, c_mask)

    def _hint_divergence(self, student, teacher, mask):
        """The hint channel's loss, a token mean over ``mask``, by ``sdpo.divergence``."""
        r = self.recipe.sdpo
        # (the TAID schedule is made exactly when sdpo.divergence is taid)
        if self.taid is not None:
            return taid_loss(student, teacher, self.taid.t, mask)
        if r.divergence == "eopd":
            return entropy_aware_kl(
                student,
                teacher,
                mask,
                entropy_threshold=r.eopd.entropy_threshold,
                forward_weight=r.eopd.forward_weight,
                temperature=r.temperature,
            )
        return generalized_jsd(student, teacher, mask, beta=r.jsd_beta, temperature=r.temperature)

    def after_step(self, rec: dict[str, Any]) -> None:
        """Called once per optimizer step with its logged line: TAID's t moves on the step's hint loss
        (steps where the channel did not fire leave it where it is)."""
        if self.taid is not None and rec.get("sdpo") is not None:
            self.taid.update(rec["sdpo"])

    def _compute_loss(self, model, inputs):
        ga = self.current_gradient_accumulation_steps
        w = self.channels.weights
        rec: dict[str, Any] = {"off": {}}
        if self.channels.on("sdpo"):
            rec["sdpo_divergence"] = self.recipe.sdpo.divergence
        total = None
        has_hint = inputs.get("has_hint")
        sdpo_now = self.channels.on("sdpo") and has_hint is not None and bool(has_hint.any())
        ddp = self.rank.distributed
        # DDP: this rank has no error site but others do; it runs the same forwards at weight 0
        stand_in = False
        # the JSD is a mean over the error-site tokens of all ranks
        if ddp and self.channels.on("sdpo"):
            local_tokens = inputs["completion_mask"][has_hint.nonzero().squeeze(-1)].sum() if sdpo_now else 0
            global_tokens = distributed.all_reduce_sum([local_tokens])[0]
            stand_in = global_tokens > 0 and not sdpo_now
        if self.channels.on("sdpo") and not (sdpo_now or stand_in):
            rec["off"]["sdpo"] = "no error site in this batch"

        if self.channels.on("grpo"):
            self._capture = sdpo_now or stand_in
            try:
                g = super()._compute_loss(model, inputs)  # already divided by ga
            finally:
                self._capture = False
            total = w.grpo * g
            rec["grpo"] = float(g.detach()) * ga

        if sdpo_now or stand_in:
            idx = (
                has_hint.nonzero().squeeze(-1) if sdpo_now else torch.zeros(1, dtype=torch.long, device=has_hint.device)
            )
            c_ids, c_mask = inputs["completion_ids"][idx], inputs["completion_mask"][idx]
            hint_ids, hint_mask = (
                (inputs["hint_ids"][idx], inputs["hint_mask"][idx])
                if sdpo_now
                else (inputs["prompt_ids"][idx], inputs["prompt_mask"][idx])
            )
            if stand_in:
                # every hint divergence of an empty span: 0 with a gradient path
                c_mask = torch.zeros_like(c_mask)
            student = self._captured_logits
            self._captured_logits = None
            with self.accelerator.autocast():
                # GRPO off: the student forward is the only one
                if student is None:
                    student = completion_logits(
                        model, inputs["prompt_ids"][idx], inputs["prompt_mask"][idx], c_ids, c_mask
                    )
                else:
                    student = student[idx]
                with torch.no_grad():
                    teacher = self._hint_teacher_logits(model, hint_ids, hint_mask, c_ids, c_mask)
            hint_loss = self._hint_divergence(student, teacher, c_mask)
            if self.taid is not None:
                rec["taid_t"] = self.taid.t
            if ddp:
                hint_loss = distributed.share_of_global_mean(hint_loss, c_mask.sum(), global_tokens, self.rank.world)
            term = w.sdpo * hint_loss / ga
            total = term if total is None else total + term
            rec["sdpo"] = float(hint_loss.detach())
            rec["error_sites"] = int(idx.numel()) if sdpo_now else 0
        self._captured_logits = None

        if self.channels.on("dpo"):
            d, margins, nll, penalty = self._dpo_loss(model)
            term = w.dpo * d / ga
            total = term if total is None else total + term
            rec["dpo"] = float(d.detach())
            rec["dpo_margin"] = float(margins.mean())
            rec["dpo_accuracy"] = float((margins > 0).float().mean())
            # the channel's loss is preference + sft_weight · this
            if nll is not None:
                rec["dpo_sft"] = float(nll.detach())
            # DPOP: the penalty term (nats; enters the logit times dpop_lambda)
            if penalty is not None:
                rec["dpo_dpop"] = float(penalty)
            rec["dpo_batch"] = self.dpo_batch_index
        if ddp:
            rec = reduce_over_ranks(rec, self.rank.world)
        if total is None:
            raise RuntimeError(f"no channel fired this step: {rec['off']}")
        self.pending.append(rec)
        return total
