"""DPO pairs from teacher consensus.

In:  ``trace_states`` + ``trace_messages`` (ingest), ``teacher_replays`` (replay), a
     :class:`PairRecipe` (``recipes/pairs.yaml``) and the render options of ``recipes/ingest.yaml``.
Out: :class:`PairsResult` with ``pairs`` (table ``dpo_pairs``: teachers agree, the agent's action
     is outside that consensus; chosen = a representative consensus answer, rejected = the
     agent's action, prompt = the rendered prefix), ``positives`` (table ``agreement_positives``:
     teachers agree *with* the agent), ``dropped`` (table ``dropped_pairs``, ``drop_op`` =
     ``pairs.build``: pairs whose chosen side echoes prompt markup, parrots a prompt message or
     repeats the prompt's last tool call word for word, with the reason) and ``stats`` (counts of every reason a state gave no row).

Per state: one answer per teacher (the latest answered, parsed replay row); answers grouped by
:mod:`composer_pipeline.pairs.signature`. A vote is a distinct *model* (``base_url`` + ``model`` of
the teachers recipe), not a teacher name: entries that send the same model at greedy decoding give
the same answer by construction and count once; entries of one model at ``temperature`` > 0 are
samples of it. :func:`find_consensus` labels each consensus with its kind:

* ``cross_model``: at least ``agreement_threshold`` distinct models share a decision and they are at
  least ``min_agreement_score`` of the models that answered (``agreement_score`` = that share);
* ``self_consistency`` (only when distinct models do not agree, and ``allow_self_consistency``): at
  least ``self_consistency_threshold`` samples of one model share a decision, at least
  ``min_agreement_score`` of its samples. Weaker evidence: one model agreeing with itself.

Every row carries ``agreement_kind``, ``n_models``, ``n_models_agreeing``, ``n_agreeing`` (votes in
the consensus: models or samples) and ``agreeing_teachers`` (the entries behind them). ``cost_usd``
sums the cost of every replay call of the state (failed ones included: they were paid for to produce
this row). ``pair_id`` = sha256(state_id|signature)[:20]. ``partition_key`` beside ``session_key`` is the
short key the Dagster UI shows for the session (``calc/a1f0c3d2``): the run's partition in Dagster,
computed over the states' sessions otherwise (:mod:`composer_pipeline.ids`).

Deliberately simplified: one consensus per state (a 2-2 split is resolved by signature order
only when ``allow_ties`` is set, otherwise skipped); representative = first agreeing teacher in
``teacher_preference`` order, then by name.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa

from composer_pipeline import render, tables
from composer_pipeline.actions import Action, ActionOrder
from composer_pipeline.ids import partition_keys
from composer_pipeline.pairs.config import PairRecipe, SignatureRules
from composer_pipeline.pairs.signature import (
    Group,
    action_signature,
    group_actions,
    markup_tags,
    same_decision,
    strip_markup,
    text_similarity,
)
from composer_pipeline.render import flatten_content


@dataclass
class PairsResult:
    pairs: pa.Table
    positives: pa.Table
    stats: dict[str, Any]
    dropped: pa.Table = field(default_factory=lambda: tables.SCHEMAS["dropped_pairs"].empty_table())


def pair_id_for(state_id: str, consensus_signature: str) -> str:
    return hashlib.sha256(f"{state_id}|{consensus_signature}".encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Voter:
    """Who stands behind a teacher's answer: a model (``base_url`` + ``model``) and how it decodes.

    Two teacher entries with the same ``model_key`` are one model. At greedy decoding
    (``sampled`` false) their answers are the same answer twice and count once; at
    ``temperature`` > 0 each entry is one sample of that model (self-consistency, not a second model).
    """

    teacher: str
    model_key: str
    sampled: bool


def voters_from_config(config) -> dict[str, Voter]:
    """teacher name -> :class:`Voter` from a :class:`~composer_pipeline.teachers.config.TeachersConfig`."""
    return {
        # no temperature sent: the model's default (1 for OpenAI and Anthropic), i.e. samples
        t.name: Voter(t.name, f"{t.base_url.rstrip('/')}|{t.model}", t.temperature is None or t.temperature > 0.0)
        for t in config.teachers
    }


def _teacher_answers(rows: list[dict], stats: dict[str, int]) -> dict[str, tuple[Action, str, str]]:
    """One (action, call_id, model) per teacher: its latest answered row with a parseable action."""
    best: dict[str, tuple[str, Action, str, str]] = {}
    for r in rows:
        # never sent by design (no_user_turn, not_escalated): not a failure
        if r.get("status") == "skipped":
            stats["replays_skipped"] += 1
            continue
        if r.get("status") != "answered" or not r.get("action"):
            stats["replays_not_answered"] += 1
            continue
        try:
            action = Action.from_json(r["action"])
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            stats["replays_bad_action_json"] += 1
            continue
        if action.is_empty:
            stats["replays_empty_action"] += 1
            continue
        key = r.get("created_at") or ""
        prev = best.get(r["teacher"])
        if prev is None or key >= prev[0]:
            best[r["teacher"]] = (key, action, r["call_id"], r.get("model") or "")
    return {t: (a, cid, m) for t, (_, a, cid, m) in best.items()}


@dataclass
class _Vote:
    """One counted answer: a greedy model once (its duplicate entries folded in) or one sample."""

    key: str
    model_key: str
    action: Action
    teachers: list[str]


@dataclass
class Consensus:
    """The agreement found at one state (see :func:`find_consensus`)."""

    kind: str  # cross_model | self_consistency
    signature: str
    representative: Action
    # teacher entries whose answers are in the consensus
    teachers: list[str]
    # distinct models (cross_model) or samples of one model (self_consistency)
    n_agreeing: int
    # n_agreeing / models that answered (cross_model) or / that model's samples
    score: float
    # distinct models that answered the state
    n_models: int
    n_models_agreeing: int


def _votes(
    answers: dict[str, tuple[Action, str, str]],
    voters: dict[str, Voter],
    pref: dict[str, int],
    rules: SignatureRules,
    stats: dict[str, int],
) -> list[_Vote]:
    """Answers -> votes: identical greedy requests of one model count once."""
    votes: dict[str, _Vote] = {}
    for t in sorted(answers, key=lambda t: (pref.get(t, len(pref)), t)):
        action, _, model = answers[t]
        # without a teachers config the replay row's model field is all that is known: two names
        # sending the same model field are taken as one greedy model (never as two votes)
        v = voters.get(t) or Voter(t, f"?|{model}", False)
        key = f"{v.model_key}|sample:{t}" if v.sampled else f"{v.model_key}|greedy"
        if key not in votes:
            votes[key] = _Vote(key, v.model_key, action, [t])
            continue
        stats["answers_greedy_duplicates"] += 1
        if same_decision(votes[key].action, action, rules):
            votes[key].teachers.append(t)
    return list(votes.values())


def _top(groups: list[Group]) -> Group | None:
    """The largest group, or None when the first two are the same size (a tie)."""
    if not groups or (len(groups) > 1 and len(groups[1].members) == len(groups[0].members)):
        return None
    return groups[0]


def find_consensus(
    answers: dict[str, tuple[Action, str, str]], voters: dict[str, Voter], recipe: PairRecipe, stats: dict[str, int]
) -> Consensus | str:
    """Agreement among distinct models first, else self-consistency of one sampled model.

    A model's vote is the decision most of its votes share (greedy: its one answer; sampled: the
    plurality of its samples, none on a tie). ``cross_model``: at least ``agreement_threshold``
    distinct models share a decision that is at least ``min_agreement_score`` of the models that
    answered and not tied with another. ``self_consistency`` (when allowed): at least
    ``self_consistency_threshold`` samples of one model share a decision, at least
    ``min_agreement_score`` of its samples. Returns the reason as a string when there is none.
    """
    rules = recipe.signature
    pref = {t: i for i, t in enumerate(recipe.teacher_preference)}
    votes = _votes(answers, voters, pref, rules, stats)
    by_model: dict[str, list[_Vote]] = {}
    for v in votes:
        by_model.setdefault(v.model_key, []).append(v)
    model_groups = {m: group_actions([(v.key, v.action) for v in vs], rules) for m, vs in by_model.items()}
    vote_by_key = {v.key: v for v in votes}
    # each model's own top group, where it has one
    model_tops: dict[str, Group] = {}
    for m, groups in sorted(model_groups.items()):
        top = _top(groups)
        if top is not None:
            model_tops[m] = top
    decisions = [(m, group.representative) for m, group in model_tops.items()]
    n_models = len(by_model)
    cross = group_actions(decisions, rules)
    reason = "no_consensus"
    if cross:
        top = cross[0]
        n = len(top.members)
        tied = len(cross) > 1 and len(cross[1].members) == n
        if n >= recipe.agreement_threshold and n / n_models >= recipe.min_agreement_score:
            if not tied or recipe.allow_ties:
                teachers = [t for m in top.members for k in model_tops[m].members for t in vote_by_key[k].teachers]
                return Consensus(
                    "cross_model", top.signature, top.representative, teachers, n, n / n_models, n_models, n
                )
            reason = "tied"
    if not recipe.allow_self_consistency:
        return reason
    best: tuple | None = None
    for m, groups in sorted(model_groups.items()):
        n_samples = len(by_model[m])
        top = _top(groups)
        if top is None or n_samples < 2:
            continue
        n, score = len(top.members), len(top.members) / n_samples
        if n >= recipe.self_consistency_threshold and score >= recipe.min_agreement_score:
            if best is None or (score, n) > (best[0], best[1]):
                best = (score, n, m, top)
    if best is None:
        return reason
    score, n, m, top = best
    teachers = [t for k in top.members for t in vote_by_key[k].teachers]
    agreeing_models = sum(1 for _, a in decisions if same_decision(a, top.representative, rules))
    return Consensus(
        "self_consistency", top.signature, top.representative, teachers, n, score, n_models, agreeing_models
    )


def pair_ruled_out(
    agent_json: str | None, rows: list[dict], voters: dict[str, Voter], recipe: PairRecipe
) -> str | None:
    """Why no more answers could make this state a pair (escalation's rule, teachers recipe ``escalation``),
    or None while they still could. ``rows``: the ``teacher_replays``-shaped answers of one state so far.

    ``agrees_with_agent``: every answer makes the agent's decision (:func:`same_decision`) and they already
    form a consensus (:func:`find_consensus`); ``agent_action_unreadable``: :func:`build_pairs` pairs no
    such state. No answers yet, an answer that differs from the agent's, or answers that agree with it
    without a consensus: None. Deliberately simplified: :func:`_valid_answers`' rules (offered tools,
    echoes) are not applied here, so an invalid answer that differs from the agent's keeps the state open
    (it errs toward calling)."""
    try:
        agent = Action.from_json(agent_json or "")
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return "agent_action_unreadable"
    if agent.is_empty:
        return "agent_action_unreadable"
    stats: Counter[str] = Counter()
    votes = [r for r in rows if r.get("finish_reason") not in tables.CUT_FINISH_REASONS]  # as build_pairs drops them
    answers = _teacher_answers(votes, stats)
    if not answers or any(not same_decision(agent, a, recipe.signature) for a, _, _ in answers.values()):
        return None
    return None if isinstance(find_consensus(answers, voters, recipe, stats), str) else "agrees_with_agent"


def _last_input_texts(prompt_json: str) -> list[str]:
    """What the model read last: the last user message and any tool results after it."""

    out: list[str] = []
    for m in reversed(orjson.loads(prompt_json)):
        if m.get("role") == "tool":
            out.append(flatten_content(m.get("content")))
        elif m.get("role") == "user":
            out.append(flatten_content(m.get("content")))
            break
        elif m.get("role") == "assistant" and out:
            break
    return [t for t in out if t.strip()]


def _valid_answers(
    answers: dict[str, tuple[Action, str, str]],
    prompt_json: str,
    tools_json: str,
    recipe: PairRecipe,
    stats: dict[str, int],
) -> dict[str, tuple[Action, str, str]]:
    """Answers that are a decision at all (each rule is a recipe switch; every refusal is counted).

    * ``require_offered_tools``: every tool call names a tool the prompt offered (the agent's tools)
      or a tool the signature rules know (``signature.key_arguments``: Claude Code's own tools);
    * ``require_key_arguments``: every call has its tool's key arguments (``signature.key_arguments``),
      e.g. a ``Bash`` call without ``command`` decides nothing;
    * ``reject_prompt_echo``: a text answer that repeats what it was just given (the last user message
      or tool result; word-bag similarity at ``signature.text_similarity_threshold``) parrots its input,
      e.g. ``<command-name>/init`` or a tool's error message.
    """
    rules = recipe.signature
    offered = {(t.get("function") or t).get("name") for t in orjson.loads(tools_json or "[]")} | set(
        rules.key_arguments
    )
    last_inputs = None
    out = {}
    for t, (action, cid, model) in answers.items():
        if action.tool_calls:
            if recipe.require_offered_tools and any(c.name not in offered for c in action.tool_calls):
                stats["answers_unknown_tool"] += 1
                continue
            if recipe.require_key_arguments and any(
                k not in c.arguments for c in action.tool_calls for k in rules.key_arguments.get(c.name) or ()
            ):
                stats["answers_missing_key_arguments"] += 1
                continue
        elif recipe.reject_prompt_echo:
            if last_inputs is None:
                last_inputs = _last_input_texts(prompt_json)
            if any(text_similarity(action.text, t) >= rules.text_similarity_threshold for t in last_inputs):
                stats["answers_echo_prompt"] += 1
                continue
        out[t] = (action, cid, model)
    return out


def parrot_reason(chosen: Action, prompt_json: str, rules: SignatureRules) -> str | None:
    """Why a chosen answer is no answer at all (None: it is one): a text answer holding markup a model
    only reads (``chosen_echoes_markup: <tags>``) or repeating a user message or tool result of its
    prompt, markup removed (``chosen_parrots_prompt``). Tool calls are never parrots."""
    if chosen.tool_calls:
        return None
    tags = markup_tags(chosen.text, rules.echo_markup_tags)
    if tags:
        return "chosen_echoes_markup: " + ", ".join(f"<{t}>" for t in tags)

    content = strip_markup(chosen.text, rules.echo_markup_tags)
    for m in orjson.loads(prompt_json):
        if m.get("role") in ("user", "tool"):
            said = strip_markup(flatten_content(m.get("content")), rules.echo_markup_tags)
            if said.strip() and text_similarity(content, said) >= rules.text_similarity_threshold:
                return "chosen_parrots_prompt"
    return None


def _call_key(name: str, arguments: Any) -> tuple[str, str]:
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return name, arguments
    return name, orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()


def last_calls(prompt_json: str) -> list[tuple[str, str]] | None:
    """The tool calls of the prompt's last assistant turn when nothing but tool results followed it (None:
    no such turn, or a user spoke since), each as (name, arguments with sorted keys)."""
    for m in reversed(orjson.loads(prompt_json)):
        role = m.get("role")
        if role == "tool":
            continue
        if role != "assistant" or not m.get("tool_calls"):
            return None
        return [
            _call_key((c.get("function") or {}).get("name") or "", (c.get("function") or {}).get("arguments") or {})
            for c in m["tool_calls"]
        ]
    return None


def repeat_reason(chosen: Action, prompt_json: str) -> str | None:
    """``chosen_repeats_last_call: <tools>`` when the answer's tool calls are the prompt's last call (or
    its last turn's calls) again, same tools and same arguments, with nothing but their results since
    (:func:`last_calls`); None otherwise. A text answer is never a repeat."""
    if not chosen.tool_calls:
        return None
    prev = last_calls(prompt_json)
    if not prev:
        return None
    mine = [_call_key(c.name, c.arguments) for c in chosen.tool_calls]
    if mine == prev or mine == prev[-1:]:
        return "chosen_repeats_last_call: " + ", ".join(c.name for c in chosen.tool_calls)
    return None


def _renderer(states: pa.Table, messages: pa.Table, render_opts):
    opts = render_opts if render_opts is not None else render.RenderOptions()
    conv = render.Conversation.from_table(messages)

    def _render(state_row: dict) -> tuple[str, str, int]:
        rs = render.render_state(conv, state_row, opts)
        return orjson.dumps(rs.messages).decode(), orjson.dumps(rs.tools).decode(), len(rs.messages)

    return _render


def build_pairs(
    states: pa.Table,
    messages: pa.Table,
    replays: pa.Table,
    recipe: PairRecipe | None = None,
    render_opts=None,
    teachers=None,
    partition_of: dict[str, str] | None = None,
) -> PairsResult:
    """Compare teachers with each other and with the agent; see the module docstring.

    ``teachers`` (the :class:`~composer_pipeline.teachers.config.TeachersConfig` the replay used)
    says which entries are the same model and which sample; without it, each distinct ``model``
    field of the replay rows is one greedy model. ``partition_of`` (session key -> partition key):
    the keys Dagster named the sessions by; default: :func:`composer_pipeline.ids.partition_keys`.
    """

    recipe = recipe or PairRecipe()
    sessions = {k for k in states.column("session_key").to_pylist() if k} if states.num_rows else set()
    partition_of = {**partition_keys(sessions - set(partition_of or ())), **(partition_of or {})}
    rules = recipe.signature
    voters = voters_from_config(teachers) if teachers is not None else {}
    stats: dict[str, int] = dict.fromkeys(STAT_KEYS, 0)
    by_state = _replays_by_state(states, replays, recipe, stats)

    pref = {t: i for i, t in enumerate(recipe.teacher_preference)}
    order = (render_opts if render_opts is not None else render.RenderOptions()).action_order
    render_fn = None
    pair_rows: list[dict] = []
    pos_rows: list[dict] = []
    drop_rows: list[dict] = []
    for st in states.to_pylist():
        stats["states"] += 1
        rows = by_state.get(st["state_id"])
        if not rows:
            stats["states_without_replays"] += 1
            continue
        if st.get("has_error") and not recipe.keep_error_states:
            stats["states_error_skipped"] += 1
            continue
        agent = _agent_action(st)
        if agent is None:
            stats["states_bad_agent_action"] += 1
            continue
        answers = _teacher_answers(rows, stats)
        n_teachers = len(answers)
        if n_teachers < max(recipe.min_teachers, recipe.min_votes):
            stats["states_too_few_teachers"] += 1
            continue
        if render_fn is None:
            render_fn = _renderer(states, messages, render_opts)
        try:
            prompt, tools_json, n_msgs = render_fn(st)
        except Exception:  # noqa: BLE001 - one unrenderable state must not sink the run; counted
            stats["states_render_error"] += 1
            continue
        # only the system prompt: the state's stream is not in trace_messages
        if n_msgs <= 1:
            stats["states_no_messages"] += 1
            continue
        answers = _valid_answers(answers, prompt, tools_json, recipe, stats)
        # counted, not refused: a repeat may be right (a flaky command); a pair never teaches it (below)
        stats["answers_repeat_last_call"] += sum(repeat_reason(a, prompt) is not None for a, _, _ in answers.values())
        found = find_consensus(answers, voters, recipe, stats)
        if isinstance(found, str):
            stats["states_tied" if found == "tied" else "states_no_consensus"] += 1
            continue
        stats[f"states_{found.kind}"] += 1
        members = sorted(found.teachers, key=lambda t: (pref.get(t, len(pref)), t))
        chosen = answers[members[0]][0]
        agrees = same_decision(agent, found.representative, rules)
        row = _pair_row(st, rows, agent, chosen, found, members, agrees, (prompt, tools_json, n_teachers, rules), order)
        row["partition_key"] = partition_of.get(st["session_key"])
        why = _drop_reason(chosen, prompt, rules, recipe, stats) if not agrees else None
        # kept, with the reason, in dropped_pairs: never a chosen side, never silent
        if why is not None:
            drop_rows.append({**row, "drop_op": "pairs.build", "drop_reason": why, "drop_stats": "{}"})
            continue
        (pos_rows if agrees else pair_rows).append(row)
    stats["pairs"], stats["positives"] = len(pair_rows), len(pos_rows)
    return PairsResult(
        pairs=_to_table(pair_rows, "dpo_pairs"),
        positives=_to_table(pos_rows, "agreement_positives"),
        stats=stats,
        dropped=_to_table(drop_rows, "dropped_pairs"),
    )


STAT_KEYS = (
    "states",
    "states_without_replays",
    "states_bad_agent_action",
    "states_too_few_teachers",
    "states_no_consensus",
    "states_tied",
    "states_cross_model",
    "states_self_consistency",
    "states_error_skipped",
    "states_no_messages",
    "states_render_error",
    "replays_not_answered",
    "replays_skipped",
    "replays_bad_action_json",
    "replays_empty_action",
    "replays_unknown_state",
    "answers_greedy_duplicates",
    "answers_unknown_tool",
    "answers_missing_key_arguments",
    "answers_echo_prompt",
    "answers_fitted_dropped",
    "answers_cut_dropped",
    "pairs_dropped_parrot",
    "answers_repeat_last_call",
    "pairs_dropped_repeat",
    "pairs",
    "positives",
)
"""What :func:`build_pairs` counts: every state, replay and answer it does not turn into a row lands in one."""


def _replays_by_state(states: pa.Table, replays: pa.Table, recipe: PairRecipe, stats: dict[str, int]) -> dict:
    """The replay rows that may vote, by state: rows of unknown states, fitted answers (when the recipe drops
    them) and answers cut at their token limit are counted and left out."""
    by_state: dict[str, list[dict]] = {}
    state_ids = set(states.column("state_id").to_pylist()) if states.num_rows else set()
    for r in replays.to_pylist():
        if r["state_id"] not in state_ids:
            stats["replays_unknown_state"] += 1
            continue
        if recipe.drop_fitted_answers and ((r.get("elided_messages") or 0) or (r.get("cut_messages") or 0)):
            stats["answers_fitted_dropped"] += 1
            continue
        # cut at its token limit: never votes, never chosen
        if r.get("finish_reason") in tables.CUT_FINISH_REASONS:
            stats["answers_cut_dropped"] += 1
            continue
        by_state.setdefault(r["state_id"], []).append(r)
    return by_state


def _agent_action(st: dict) -> Action | None:
    """The agent's recorded action, or None when it does not parse or is empty."""
    try:
        agent = Action.from_json(st["action"])
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None
    return None if agent.is_empty else agent


def _drop_reason(chosen: Action, prompt: str, rules, recipe: PairRecipe, stats: dict[str, int]) -> str | None:
    """Why a pair's chosen side must not be taught (it parrots the prompt, or repeats the last call), counted."""
    why = parrot_reason(chosen, prompt, rules) if recipe.drop_parroting_chosen else None
    if why is not None:
        stats["pairs_dropped_parrot"] += 1
    elif recipe.drop_repeating_chosen and (why := repeat_reason(chosen, prompt)) is not None:
        stats["pairs_dropped_repeat"] += 1
    return why


def _pair_row(
    st: dict,
    rows: list[dict],
    agent: Action,
    chosen: Action,
    found,
    members: list[str],
    agrees: bool,
    answered: tuple,
    order: ActionOrder = "sorted",
) -> dict:
    """The row of one state whose teachers agreed; ``answered``: (prompt, tools JSON, number of teachers that
    answered, the pair rules); ``order``: the texts' tool-call key order (``render.action_order``);
    ``partition_key`` is set by the caller."""
    prompt, tools_json, n_teachers, rules = answered
    return {
        "pair_id": pair_id_for(st["state_id"], found.signature),
        "kind": "positive" if agrees else "pair",
        "state_id": st["state_id"],
        "session_key": st["session_key"],
        "partition_key": None,  # set by the caller
        "session_id": st.get("session_id"),
        "source_file": st.get("source_file"),
        # (states stored before the column: Claude Code's)
        "source": st.get("source") or "claude",
        "source_lines": st.get("source_lines") or [],
        "record_uuids": st.get("record_uuids") or [],
        "replay_call_ids": sorted(r["call_id"] for r in rows),
        "prompt": prompt,
        "tools": tools_json,
        "chosen": chosen.to_json(),
        "rejected": agent.to_json(),
        "chosen_text": chosen.to_text(order),
        "rejected_text": agent.to_text(order),
        "agreement_kind": found.kind,
        "n_teachers": n_teachers,
        "n_models": found.n_models,
        "n_models_agreeing": found.n_models_agreeing,
        "n_agreeing": found.n_agreeing,
        "agreeing_teachers": members,
        "agreement_score": found.score,
        "consensus_signature": found.signature,
        "agent_signature": action_signature(agent, rules),
        "cost_usd": float(sum(r.get("cost_usd") or 0.0 for r in rows)),
        "has_error": bool(st.get("has_error")),
        "error_after": st.get("error_after"),
    }


def agreement_label(r: dict) -> str:
    """What agreed, in words: ``2 of 2 models`` or ``2 of 3 samples of one model (1 of 2 models)``."""
    if r.get("agreement_kind") == "self_consistency":
        score = r.get("agreement_score")
        samples = round(r["n_agreeing"] / score) if score else r["n_agreeing"]
        return (
            f"{r['n_agreeing']} of {samples} samples of one model "
            f"({r.get('n_models_agreeing')} of {r.get('n_models')} models)"
        )
    if r.get("agreement_kind") == "cross_model":
        return f"{r['n_agreeing']} of {r.get('n_models')} models"
    return f"{r.get('n_agreeing')} of {r.get('n_teachers')} teachers (kind not recorded)"


def _to_table(rows: list[dict], name: str) -> pa.Table:
    schema = tables.SCHEMAS[name]
    if not rows:
        return schema.empty_table()
    return pa.Table.from_pylist(rows, schema=schema)
