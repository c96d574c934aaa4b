"""Training inputs from what the pipeline stored: GRPO prompts, error sites, DPO pairs, held-out split.

In:  a Store root (local dir, ``s3://``, flat CLI layout or Dagster partitioned layout) holding
     ``normalized_dpo_pairs`` (``pairs.parquet``), ``agreement_positives`` (``positives.parquet``)
     and optionally ``trace_states`` (adds ``has_error``/``error_after`` where a pair row lacks them).
Out: :class:`TrainData`: typed :class:`PromptRow` (one per trace state: the rendered prompt
     messages, tools, agent action, teacher consensus, error) and :class:`PairRow` (DPO pairs),
     each split train / held-out, plus :class:`Skipped` rows (bad input, with the reason).
     Tokenized for TRL: :func:`grpo_records` (the GRPO dataset rows) and :func:`dpo_batches_from`
     (pre-tokenized DPO batches).

* A prompt per state comes from the pair tables' ``prompt`` column (the render.py output the
  teachers saw). ``kind == pair``: consensus = ``chosen``; ``kind == positive``: teachers agreed
  with the agent, so consensus = the agent's action.
* DPO uses ``kind == pair`` rows only (a positive has chosen == rejected).
* Held-out split: first 8 bytes of sha256(``state_id``) as a fraction < ``heldout_fraction``.
  Pairs are split by their state too, so a held-out state is never trained on by any channel.
* Prompt text: the tokenizer's chat template (``add_generation_prompt``), left-truncated to the
  last ``max_prompt_tokens`` tokens (the end of a long agent context is the part that decides).

* States with no pair/positive row (no teacher replay yet) come from ``trace_states`` +
  ``trace_messages``, rendered by :func:`composer_pipeline.render.render_states` (the function
  replay sends); they have no consensus (``consensus_match`` does not apply) and their hint, at an
  error site, names the error only. So an ingest-only directory already trains GRPO + SDPO
  (DPO reported off: no pairs).

Deliberately simplified: every state is one prompt, however many pairs it has.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

import orjson

from composer_pipeline.actions import ACTION_ORDERS, Action, ActionOrder
from composer_pipeline.chat import prompt_text
from composer_pipeline.render import Conversation, RenderOptions, render_state
from composer_pipeline.store import Store
from composer_pipeline.train.config import HintTemplates, TrainRecipe
from composer_pipeline.train.hints import build_hint, with_hint
from composer_pipeline.train.rewards import tool_names_in, tool_names_of


@dataclass(frozen=True)
class PromptRow:
    state_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    tool_names: list[str]
    agent_action: str  # JSON Action
    # JSON Action, "" where no teacher consensus exists
    consensus: str
    has_error: bool
    error_after: str | None
    # corrective hint at an error site (None elsewhere)
    hint: str | None


@dataclass(frozen=True)
class PairRow:
    pair_id: str
    state_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    chosen_text: str
    rejected_text: str


@dataclass(frozen=True)
class Skipped:
    table: str
    row_id: str
    reason: str


@dataclass
class TrainData:
    prompts: list[PromptRow] = field(default_factory=list)
    pairs: list[PairRow] = field(default_factory=list)
    heldout_prompts: list[PromptRow] = field(default_factory=list)
    heldout_pairs: list[PairRow] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    # the completions' tool-call key order (the render recipe's ``action_order``): hints, GRPO targets
    action_order: ActionOrder = "sorted"

    def summary(self) -> dict[str, Any]:
        return {
            "prompts": len(self.prompts),
            "error_sites": sum(p.hint is not None for p in self.prompts),
            "pairs": len(self.pairs),
            "heldout_prompts": len(self.heldout_prompts),
            "heldout_error_sites": sum(p.hint is not None for p in self.heldout_prompts),
            "heldout_pairs": len(self.heldout_pairs),
            "skipped": [s.__dict__ for s in self.skipped],
        }


def is_heldout(key: str, fraction: float) -> bool:
    """Deterministic split: sha256(key) read as a number in [0, 1)."""
    if fraction <= 0:
        return False
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
    return h < fraction


def _json_list(s: str | None, what: str) -> list:
    if not s:
        return []
    v = orjson.loads(s)
    if not isinstance(v, list):
        raise ValueError(f"{what} is not a JSON list")
    return v


def load_train_data(
    data_root: str,
    *,
    heldout_fraction: float,
    hints: HintTemplates,
    include_unpaired_states: bool = True,
    render_recipe: str | None = None,
) -> TrainData:
    """Read the pair tables and trace states under ``data_root`` into train/held-out rows.

    ``render_recipe``'s ``action_order`` is the order the hints and GRPO targets are written in; a pair
    whose stored texts are the other order (pairs built under another setting) is refused: rebuild them."""
    store = Store(data_root)
    opts = RenderOptions.from_recipe(render_recipe)
    has_pairs = store.exists("normalized_dpo_pairs") or store.exists("agreement_positives")
    has_states = store.exists("trace_states") and store.exists("trace_messages")
    if not has_pairs and not (include_unpaired_states and has_states):
        raise FileNotFoundError(
            f"no training data under {data_root}: expected pairs.parquet / positives.parquet "
            "(`composer-pipeline pairs`) or trace_states.parquet + trace_messages.parquet (`composer-pipeline ingest`)"
        )
    errors: dict[str, tuple[bool, str | None]] = {}
    if store.exists("trace_states"):
        st = store.read_table("trace_states", columns=["state_id", "has_error", "error_after"]).to_pylist()
        errors = {r["state_id"]: (bool(r["has_error"]), r["error_after"]) for r in st}

    data = TrainData(action_order=opts.action_order)
    seen_states: set[str] = set()
    for table in ("normalized_dpo_pairs", "agreement_positives"):
        if not store.exists(table):
            continue
        for r in store.read_table(table).to_pylist():
            rid = r.get("pair_id") or r.get("state_id") or "?"
            try:
                if not r.get("state_id"):
                    raise ValueError("no state_id")
                messages = _json_list(r.get("prompt"), "prompt")
                if not messages:
                    raise ValueError("empty prompt")
                tools = _json_list(r.get("tools"), "tools")
                agent = r.get("rejected") or "{}"
                Action.from_json(agent)
                consensus = r.get("chosen") if r.get("kind") == "pair" else agent
                has_error, error_after = bool(r.get("has_error")), r.get("error_after")
                if not has_error and r["state_id"] in errors:
                    has_error, error_after = errors[r["state_id"]]
                hint = build_hint(agent, error_after, consensus, hints, opts.action_order) if has_error else None
            except (ValueError, KeyError, TypeError, orjson.JSONDecodeError) as e:
                data.skipped.append(Skipped(table, rid, f"{type(e).__name__}: {e}"))
                continue
            held = is_heldout(r["state_id"], heldout_fraction)
            if r.get("kind") == "pair":
                _check_order(r, opts.action_order)
                if not (r.get("chosen_text") or "").strip() or not (r.get("rejected_text") or "").strip():
                    data.skipped.append(Skipped(table, rid, "empty chosen_text or rejected_text"))
                elif r["chosen_text"] == r["rejected_text"]:
                    data.skipped.append(Skipped(table, rid, "chosen_text == rejected_text"))
                else:
                    pair = PairRow(r["pair_id"], r["state_id"], messages, tools, r["chosen_text"], r["rejected_text"])
                    (data.heldout_pairs if held else data.pairs).append(pair)
            if r["state_id"] in seen_states:
                continue
            seen_states.add(r["state_id"])
            row = PromptRow(
                state_id=r["state_id"],
                messages=messages,
                tools=tools,
                tool_names=tool_names_of(r.get("tools")),
                agent_action=agent,
                consensus=consensus or "",
                has_error=has_error,
                error_after=error_after,
                hint=hint,
            )
            (data.heldout_prompts if held else data.prompts).append(row)
    if include_unpaired_states and has_states:
        _add_unpaired_states(store, data, seen_states, heldout_fraction, hints, opts)
    return data


def _check_order(pair: dict, order: ActionOrder) -> None:
    """Refuse a pair whose stored texts are its actions in the other tool-call key order: the DPO texts
    and the trainer's own (hints, GRPO targets) would differ in format."""
    try:
        chosen, rejected = Action.from_json(pair.get("chosen") or "{}"), Action.from_json(pair.get("rejected") or "{}")
    except (ValueError, KeyError, TypeError, orjson.JSONDecodeError):
        return
    for other in ACTION_ORDERS:
        if other == order or not (chosen.tool_calls or rejected.tool_calls):
            continue
        stored = (pair.get("chosen_text"), pair.get("rejected_text"))
        if (
            stored
            == (chosen.to_text(other), rejected.to_text(other))
            != (chosen.to_text(order), rejected.to_text(order))
        ):
            raise ValueError(
                f"pair {pair.get('pair_id')}: its texts are in action_order {other!r}, the trainer's render recipe "
                f"says {order!r}: rebuild the pairs with the same render.action_order (or set data.render_recipe)"
            )


def _add_unpaired_states(
    store: Store, data: TrainData, seen: set[str], fraction: float, hints: HintTemplates, opts: RenderOptions
) -> None:
    states = store.read_table("trace_states")
    todo = [r for r in states.to_pylist() if r["state_id"] not in seen]
    if not todo:
        return
    conv = Conversation.from_table(store.read_table("trace_messages"))
    for st in todo:
        try:
            rendered = render_state(conv, st, opts)
            if not rendered.messages:
                raise ValueError("empty rendered prompt")
            Action.from_json(st["action"])
            has_error = bool(st.get("has_error"))
            hint = (
                build_hint(st["action"], st.get("error_after"), None, hints, opts.action_order) if has_error else None
            )
        except (ValueError, KeyError, TypeError, orjson.JSONDecodeError) as e:
            data.skipped.append(Skipped("trace_states", st.get("state_id") or "?", f"{type(e).__name__}: {e}"))
            continue
        seen.add(st["state_id"])
        tools = rendered.tools
        row = PromptRow(
            state_id=st["state_id"],
            messages=rendered.messages,
            tools=tools,
            tool_names=tool_names_in(tools),
            agent_action=st["action"],
            consensus="",
            has_error=has_error,
            error_after=st.get("error_after"),
            hint=hint,
        )
        (data.heldout_prompts if is_heldout(st["state_id"], fraction) else data.prompts).append(row)


# -- rendering -------------------------------------------------------------------------------
def render_chat_prompt(tokenizer, messages: list[dict], tools: list[dict], max_prompt_tokens: int) -> str:
    """Chat-template text with the generation prompt, at most ``max_prompt_tokens`` tokens: the one
    renderer the local teacher server also uses (:func:`composer_pipeline.chat.prompt_text`)."""

    return prompt_text(tokenizer, messages, tools, max_prompt_tokens)


def interleave_error_sites(rows: list[PromptRow], group: int, seed: int) -> list[PromptRow]:
    """Deterministic order in which each block of ``group`` prompts holds an error site when possible.

    GRPO batches are consecutive blocks of this order (the sampler does not reshuffle), so the
    hint channel has inputs at as many steps as the data allows.
    """

    rng = random.Random(seed)
    err = [r for r in rows if r.hint is not None]
    ok = [r for r in rows if r.hint is None]
    rng.shuffle(err)
    rng.shuffle(ok)
    out: list[PromptRow] = []
    while err or ok:
        block = [err.pop()] if err else []
        while len(block) < group and (ok or err):
            block.append(ok.pop() if ok else err.pop())
        out.extend(block)
    return out


def grpo_records(
    tokenizer, rows: list[PromptRow], max_prompt_tokens: int, hint_role: str, action_order: ActionOrder = "sorted"
) -> list[dict[str, Any]]:
    """Rows for TRL's GRPO dataset: ``prompt`` text plus the columns rewards and the hint channel read;
    ``consensus_text`` in ``action_order`` (:attr:`TrainData.action_order`)."""
    out = []
    for r in rows:
        out.append(
            {
                "prompt": render_chat_prompt(tokenizer, r.messages, r.tools, max_prompt_tokens),
                "hint_prompt": render_chat_prompt(
                    tokenizer, with_hint(r.messages, r.hint, hint_role), r.tools, max_prompt_tokens
                )
                if r.hint
                else "",
                "state_id": r.state_id,
                "tool_names": r.tool_names,
                "consensus": r.consensus,
                "consensus_text": Action.from_json(r.consensus).to_text(action_order) if r.consensus else "",
            }
        )
    return out


def dpo_batch_order(n_batches: int, epoch: int, seed: int, data_order: str) -> list[int]:
    """Which batch each step of pass ``epoch`` over ``n_batches`` takes (``dpo.data_order``): the built
    order on the first pass, a seeded permutation on every later one (``shuffled``); always the built
    order (``table``). The same on every rank, so DDP's shards of a step belong to one batch."""
    order = list(range(n_batches))
    if data_order == "shuffled" and epoch > 0:
        random.Random(f"dpo-batches:{seed}:{epoch}").shuffle(order)
    return order


def dpo_pairs_in(n_pairs: int, batch_size: int, batches: set[int]) -> int:
    """Distinct pairs in the batches ``batches`` of :func:`dpo_batches_from` (the last one may be short)."""
    return sum(max(0, min(batch_size, n_pairs - i * batch_size)) for i in batches)


def dpo_batches_from(tokenizer, pairs, recipe: TrainRecipe) -> list[dict]:
    """Pre-tokenized DPO batches: rows ``[chosen_1..n, rejected_1..n]`` sharing prompts; the pairs in
    ``dpo.data_order`` (``shuffled``: a seeded permutation by ``optim.seed``; ``table``: as given)."""
    import torch

    if recipe.dpo.data_order == "shuffled":
        pairs = random.Random(f"dpo-pairs:{recipe.optim.seed}").sample(list(pairs), len(pairs))
    bs = recipe.dpo.batch_size
    eos = tokenizer.eos_token or ""
    pad = tokenizer.pad_token_id
    out = []
    for i in range(0, len(pairs), bs):
        chunk = pairs[i : i + bs]
        shared = [
            tokenizer(
                render_chat_prompt(tokenizer, p.messages, p.tools, recipe.data.max_prompt_tokens),
                add_special_tokens=False,
            )["input_ids"]
            for p in chunk
        ]  # one prompt per pair, both sides
        prompts, comps = [], []
        for side in ("chosen_text", "rejected_text"):
            for p, prompt in zip(chunk, shared):
                prompts.append(prompt)
                c = tokenizer(getattr(p, side) + eos, add_special_tokens=False)["input_ids"]
                comps.append(c[: recipe.dpo.max_completion_tokens])
        pw, cw = max(map(len, prompts)), max(map(len, comps))
        out.append(
            {
                "prompt_ids": torch.tensor([[pad] * (pw - len(x)) + x for x in prompts]),
                "prompt_mask": torch.tensor([[0] * (pw - len(x)) + [1] * len(x) for x in prompts]),
                "completion_ids": torch.tensor([x + [pad] * (cw - len(x)) for x in comps]),
                "completion_mask": torch.tensor([[1] * len(x) + [0] * (cw - len(x)) for x in comps]),
            }
        )
    return out
