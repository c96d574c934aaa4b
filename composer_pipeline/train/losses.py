"""Loss math of the three-channel trainer, as small pure functions over tensors.

In:  logits / per-sequence log-probs (torch tensors) and masks.
Out: scalar losses (and per-row values where a caller logs them).

* :func:`generalized_jsd` — the generalized Jensen-Shannon divergence of Agarwal et al. 2023
  ("On-Policy Distillation of Language Models", eq. 1): mixture ``M = β·T + (1-β)·S``,
  ``JSD_β = β·KL(T‖M) + (1-β)·KL(S‖M)``; β=0 is forward KL(T‖S), β=1 reverse KL(S‖T)
  (the same convention as ``trl.experimental.gkd.GKDTrainer.generalized_jsd_loss``, which the
  tests use as the parity reference). Averaged over the tokens of a span mask only.
* :func:`taid_loss` and :class:`TaidSchedule` — TAID (arXiv 2501.16937): cross-entropy to the
  interpolated target ``softmax((1-t)·stopgrad(z_s) + t·z_T)``, with its adaptive schedule of ``t``.
* :func:`entropy_aware_kl` — entropy-aware OPD (arXiv 2603.07079): reverse KL plus forward KL at the
  tokens where the teacher's entropy is above a threshold.
* :func:`dpo_sigmoid_loss` — DPO (Rafailov et al. 2023) with the sigmoid loss and optional
  conservative label smoothing (cDPO): ``-(1-ε)·logσ(βΔ) - ε·logσ(-βΔ)``; with ``dpop_lambda`` > 0,
  DPO-Positive (Pal et al. 2024, "Smaug", arXiv 2402.13228, eq. 3): ``Δ - λ·max(0, log π_ref(y_w|x) -
  log π_θ(y_w|x))`` inside the sigmoid (:func:`dpop_penalty`).
* :func:`simpo_loss` — SimPO (Meng et al. 2024): reference-free, length-normalised log-probs,
  ``-logσ(β·(avg_c - avg_r) - γ)``.
* :func:`chosen_nll` — the RPO term (Pang et al. 2024): NLL of the chosen completions, token mean,
  added to the preference loss with ``dpo.sft_weight``.
* :func:`completion_logps` — sum (or mean) log-prob of the completion tokens of a
  ``[left-padded prompt | right-padded completion]`` batch, plus the position-id helper.

Deliberately simplified: full-vocabulary distributions (no top-k with a tail bucket as in the
SDPO reference code); no importance-sampling correction on the distillation term.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def generalized_jsd(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    beta: float = 0.5,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Mean generalized JSD per masked token between student and teacher next-token distributions.

    ``student_logits``/``teacher_logits``: ``(B, T, V)``; ``mask``: ``(B, T)`` 1 where the token is in
    the targeted span. Returns a scalar; 0 (with a gradient path) when the mask is empty.
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student {tuple(student_logits.shape)} and teacher {tuple(teacher_logits.shape)} logits differ"
        )
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"jsd beta must be in [0, 1], got {beta}")
    log_s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    # identical distributions contribute exactly 0 (not ~1e-9 of rounding)
    same = log_t == log_s
    if beta == 0.0:  # KL(T || S)
        per_token = (log_t.exp() * (log_t - log_s)).sum(-1)
    elif beta == 1.0:  # KL(S || T)
        per_token = (log_s.exp() * (log_s - log_t)).sum(-1)
    else:
        log_m = torch.logsumexp(
            torch.stack([log_t + torch.log(torch.tensor(beta)), log_s + torch.log1p(torch.tensor(-beta))]), dim=0
        )
        kl_t = (log_t.exp() * (log_t - log_m)).sum(-1)
        kl_s = (log_s.exp() * (log_s - log_m)).sum(-1)
        per_token = beta * kl_t + (1.0 - beta) * kl_s
    per_token = torch.where(same.all(-1), torch.zeros_like(per_token), per_token)
    if mask is None:
        return per_token.mean()
    m = mask.to(per_token.dtype)
    return (per_token * m).sum() / m.sum().clamp_min(1.0)


def dpo_sigmoid_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    dpop_lambda: float = 0.0,
    penalty_chosen: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DPO sigmoid loss over per-sequence summed log-probs. Returns ``(loss, margins)``; the margins are
    ``β·Δ`` without the DPOP penalty (the preference itself, what ``dpo_accuracy`` counts).

    With policy == reference the margin is 0 and the loss is exactly ``ln 2`` (the DPOP penalty is 0 there
    too). ``dpop_lambda`` > 0: DPO-Positive, ``Δ - λ·dpop_penalty`` inside the sigmoid. The penalty reads
    ``penalty_chosen = (policy, reference)`` log-probs of the chosen answers when given (the whole
    answer, where ``Δ`` sums fewer tokens), else ``policy_chosen``/``ref_chosen``.
    """
    delta = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected)
    logits = delta
    if dpop_lambda:
        pol_w, ref_w = penalty_chosen if penalty_chosen is not None else (policy_chosen, ref_chosen)
        logits = delta - dpop_lambda * dpop_penalty(pol_w, ref_w)
    losses = -(1.0 - label_smoothing) * F.logsigmoid(beta * logits) - label_smoothing * F.logsigmoid(-beta * logits)
    return losses.mean(), (beta * delta).detach()


def dpop_penalty(policy_chosen: torch.Tensor, ref_chosen: torch.Tensor) -> torch.Tensor:
    """DPO-Positive's penalty per pair (Pal et al. 2024, "Smaug", arXiv 2402.13228, eq. 3, as corrected in
    its v3 of July 2024: the term sits inside ``β·(...)``): ``max(0, log π_ref(y_w|x) - log π_θ(y_w|x))``,
    in nats, over per-sequence summed log-probs. Zero while the chosen answer is at least as likely as under
    the reference; it grows as the chosen answer falls below it. ``relu``, so its gradient is 0 at the
    kink (policy == reference, the first step)."""
    return F.relu(ref_chosen - policy_chosen)


def simpo_loss(
    policy_chosen_avg: torch.Tensor,
    policy_rejected_avg: torch.Tensor,
    *,
    beta: float = 2.0,
    gamma: float = 0.5,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SimPO loss over per-sequence *mean* log-probs (no reference model). Returns ``(loss, margins)``."""
    logits = beta * (policy_chosen_avg - policy_rejected_avg) - gamma
    return -F.logsigmoid(logits).mean(), logits.detach()


def position_ids_for(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that ignore left padding (needed by absolute-position models; harmless for RoPE)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
    """Logits ``(B, C, V)`` predicting each of the ``C`` completion tokens (the last C columns)."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    return last_token_logits(model, input_ids, attention_mask, completion_ids.size(1))


def last_token_logits(model, input_ids, attention_mask, n: int) -> torch.Tensor:
    """Logits ``(B, n, V)`` predicting the last ``n`` tokens of ``input_ids`` (left padding aware)."""
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_for(attention_mask),
        logits_to_keep=n + 1,
        use_cache=False,
    )
    return out.logits[:, :-1, :]


def token_logps(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-token log-prob of ``ids`` under ``logits / temperature`` (``(B, C)``)."""
    logp = F.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def chosen_nll(chosen_token_logps: torch.Tensor, chosen_mask: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood of the chosen completions, a mean over all their tokens in the batch (as
    TRL's DPO ``loss_type="sft"`` computes it): the RPO term (Pang et al. 2024, arXiv:2404.19733)."""
    return -(chosen_token_logps * chosen_mask).sum() / chosen_mask.sum().clamp_min(1)


def completion_token_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
    """Per-token completion log-probs ``(B, C)``, 0 on padding."""
    logits = completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask)
    return token_logps(logits, completion_ids) * completion_mask


def completion_logps(
    model, prompt_ids, prompt_mask, completion_ids, completion_mask, *, average: bool = False
) -> torch.Tensor:
    """Per-sequence summed (or mean, ``average=True``) completion log-probs ``(B,)``."""
    total = completion_token_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask).sum(-1)
    if average:
        return total / completion_mask.sum(-1).clamp_min(1)
    return total


# -- the hint channel's other divergences ------------------------------------------------------
def _masked_token_mean(per_token: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return per_token.mean()
    m = mask.to(per_token.dtype)
    return (per_token * m).sum() / m.sum().clamp_min(1.0)


def taid_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, t: float, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """TAID (Shing et al., ICLR 2025, arXiv 2501.16937, eq. for the interpolated target): cross-entropy of
    the student to ``p_t = softmax((1 - t)·stopgrad(z_s) + t·z_T)``, a token mean over ``mask``.

    ``(B, T, V)`` logits, a ``(B, T)`` mask; float32 throughout. A cross-entropy, not a KL: at ``t = 0``
    the value is the student's entropy and the gradient is 0 (the target is the detached student itself).
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student {tuple(student_logits.shape)} and teacher {tuple(teacher_logits.shape)} logits differ"
        )
    if not 0.0 <= t <= 1.0:
        raise ValueError(f"taid t must be in [0, 1], got {t}")
    student = student_logits.float()
    target = F.softmax((1.0 - t) * student.detach() + t * teacher_logits.float(), dim=-1)
    per_token = -(target * F.log_softmax(student, dim=-1)).sum(-1)
    return _masked_token_mean(per_token, mask)


class TaidSchedule:
    """TAID's adaptive interpolation schedule (arXiv 2501.16937, Algorithm 1; reference code
    SakanaAI/TAID ``src/distil_losses/taid.py``).

    ``t`` starts at ``t_start``. ``update(loss)`` is called once after each step with that step's loss
    (the step itself used the ``t`` from before the call). The first call only records the loss; each later
    one: ``rel = (prev - loss) / (prev + 1e-15)``, ``momentum = β·momentum + (1 - β)·rel``,
    ``δ = α·sigmoid(momentum)·(1 - t)``, ``target = t_start + (t_end - t_start)·steps_done/total_steps``
    (``steps_done``: the calls so far, this one included), ``t = min(t_end, max(target, t + δ))``, or
    ``target`` alone with ``adaptive=False`` (capped at ``t_end`` too).
    """

    def __init__(
        self,
        t_start: float = 0.4,
        t_end: float = 1.0,
        alpha: float = 5e-4,
        beta: float = 0.99,
        total_steps: int = 1,
        adaptive: bool = True,
    ):
        if not 0.0 <= t_start <= t_end <= 1.0:
            raise ValueError(f"taid needs 0 <= t_start <= t_end <= 1, got t_start={t_start}, t_end={t_end}")
        if total_steps < 1:
            raise ValueError(f"taid total_steps must be >= 1, got {total_steps}")
        self.t_start, self.t_end, self.alpha, self.beta = t_start, t_end, alpha, beta
        self.total_steps, self.adaptive = total_steps, adaptive
        self.t = t_start
        self.momentum = 0.0
        self.steps_done = 0
        self.prev_loss: float | None = None

    def update(self, loss: float) -> float:
        """Record one step's loss and move ``t``; returns the new ``t``."""
        loss = float(loss)
        self.steps_done += 1
        if self.prev_loss is None:
            self.prev_loss = loss
            return self.t
        rel = (self.prev_loss - loss) / (self.prev_loss + 1e-15)
        self.momentum = self.beta * self.momentum + (1.0 - self.beta) * rel
        delta = self.alpha * (1.0 / (1.0 + math.exp(-self.momentum))) * (1.0 - self.t)
        target = self.t_start + (self.t_end - self.t_start) * self.steps_done / self.total_steps
        self.t = min(self.t_end, max(target, self.t + delta) if self.adaptive else target)
        self.prev_loss = loss
        return self.t


def entropy_aware_kl(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    entropy_threshold: float = 1.0,
    forward_weight: float = 1.0,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Entropy-aware on-policy distillation (Jin et al., ICML 2026, arXiv 2603.07079): reverse KL(S‖T)
    at every token, plus forward KL(T‖S) at the tokens where the TEACHER's entropy is high.

    Per token: ``KL(S‖T) + forward_weight · 1[H(T) > entropy_threshold] · KL(T‖S)``, a token mean over
    ``mask``. From the paper (its abstract and summaries; its equations could not be read here): reverse
    KL everywhere, forward KL added where the teacher's token entropy is high, the gate computed from the
    teacher's distribution. Our choices: a hard gate on an absolute entropy in nats (``entropy_threshold``,
    default 1.0), the gate taken without gradient, the forward term's weight (``forward_weight``, default
    1.0) and the shared softmax ``temperature``.
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student {tuple(student_logits.shape)} and teacher {tuple(teacher_logits.shape)} logits differ"
        )
    log_s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    reverse = (log_s.exp() * (log_s - log_t)).sum(-1)
    forward = (log_t.exp() * (log_t - log_s)).sum(-1)
    with torch.no_grad():
        gate = (teacher_entropy(teacher_logits, temperature) > entropy_threshold).to(reverse.dtype)
    return _masked_token_mean(reverse + forward_weight * gate * forward, mask)


def teacher_entropy(teacher_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-token entropy (nats) of ``softmax(logits / temperature)``, ``(B, T)``."""
    log_t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    return -(log_t.exp() * log_t).sum(-1)


def differing_token_masks(
    completion_ids: torch.Tensor, completion_mask: torch.Tensor, n: int, *, first_only: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """For a DPO batch ``[chosen_1..n, rejected_1..n]`` (right-padded completions): per side, the mask of
    the tokens from the first one where the two answers differ to the last one before their common
    ending. ``(chosen_mask, rejected_mask)``, each ``(n, C)``.

    The shared beginning cancels in the DPO margin anyway (same context, same tokens); the shared
    ending does not (it follows different tokens), so a margin over whole answers also pushes down the
    rejected answer's closing structure (``"}\\n</tool_call>`` and eos), which every answer needs.
    When one answer is a prefix/suffix of the other the shorter side's span may be empty; an
    all-equal pair (dropped before training) gives two empty spans. ``first_only``: only the first
    differing token of each side (the decision: ``}`` closing a Read's arguments vs ``,"new_string"`` of an
    Edit on the same path), so no token after it, content or structure, is pushed down.
    """
    out = torch.zeros_like(completion_mask)
    lens = completion_mask.sum(-1).tolist()
    for i in range(n):
        c = completion_ids[i, : int(lens[i])].tolist()
        r = completion_ids[n + i, : int(lens[n + i])].tolist()
        start = 0
        while start < min(len(c), len(r)) and c[start] == r[start]:
            start += 1
        # common ending, not overlapping the common beginning
        end = 0
        while end < min(len(c), len(r)) - start and c[len(c) - 1 - end] == r[len(r) - 1 - end]:
            end += 1
        if first_only:
            out[i, start : min(start + 1, len(c) - end)] = 1
            out[n + i, start : min(start + 1, len(r) - end)] = 1
        else:
            out[i, start : len(c) - end] = 1
            out[n + i, start : len(r) - end] = 1
    return out[:n], out[n:]
