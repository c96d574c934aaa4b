"""DPO pairs from teacher consensus.

In:  ``trace_states`` + ``trace_messages`` (ingest), ``teacher_replays`` (replay), a
     :class:`PairRecipe` (``recipes/pairs.yaml``) and the render options of ``recipes/ingest.yaml``.
Out: :class:`PairsResult` with ``pairs`` (table ``dpo_pairs``: teachers agree, the agent's action
     is outside that consensus; chosen = a representative consensus answer, rejected = the
     agent's action, prompt = the rendered prefix), ``positives`` (table ``agreement_positives``:
     teachers agree *with* the agent) and ``stats`` (counts of every reason a state gave no row).

Per state: one answer per teacher (the latest answered, parsed replay row); answers grouped by
:mod:`composer_pipeline.pairs.signature`; the largest group is the consensus when it has at least
``agreement_threshold`` teachers and ``agreement_score = n_agreeing / n_teachers`` reaches
``min_agreement_score``. ``cost_usd`` sums the cost of every replay call of the state (failed
ones included: they were paid for to produce this row). ``pair_id`` = sha256(state_id|signature)[:20].

Deliberately simplified: one consensus per state (a 2-2 split is resolved by signature order
only when ``allow_ties`` is set, otherwise skipped); representative = first agreeing teacher in
``teacher_preference`` order, then by name.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import yaml

from composer_pipeline import tables
from composer_pipeline.actions import Action
from composer_pipeline.pairs.signature import SignatureRules, action_signature, group_actions, same_decision

DEFAULT_RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "pairs.yaml"


@dataclass(frozen=True)
class PairRecipe:
    agreement_threshold: int = 2
    min_agreement_score: float = 0.5
    min_teachers: int = 2
    allow_ties: bool = False
    keep_error_states: bool = True
    teacher_preference: tuple[str, ...] = ()
    signature: SignatureRules = field(default_factory=SignatureRules)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "PairRecipe":
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"pairs recipe: unknown keys {sorted(unknown)} (known: {sorted(known)})")
        kw: dict[str, Any] = {}
        for k in ("agreement_threshold", "min_teachers"):
            if k in d:
                kw[k] = int(d[k])
                if kw[k] < 1:
                    raise ValueError(f"pairs recipe: {k} must be >= 1")
        if "min_agreement_score" in d:
            kw["min_agreement_score"] = float(d["min_agreement_score"])
            if not 0.0 <= kw["min_agreement_score"] <= 1.0:
                raise ValueError("pairs recipe: min_agreement_score must be in [0, 1]")
        for k in ("allow_ties", "keep_error_states"):
            if k in d:
                kw[k] = bool(d[k])
        if "teacher_preference" in d:
            kw["teacher_preference"] = tuple(str(t) for t in d["teacher_preference"] or ())
        kw["signature"] = SignatureRules.from_dict(d.get("signature"))
        return cls(**kw)

    @classmethod
    def load(cls, path: str | Path | None = None) -> "PairRecipe":
        """Read ``recipes/pairs.yaml`` (or ``path``); ``None`` means the packaged default."""
        p = Path(path) if path else DEFAULT_RECIPE
        if not p.is_file():
            if path is None:
                return cls()
            raise FileNotFoundError(f"pairs recipe not found: {p}")
        return cls.from_dict(yaml.safe_load(p.read_text()) or {})


@dataclass
class PairsResult:
    pairs: pa.Table
    positives: pa.Table
    stats: dict[str, Any]


def pair_id_for(state_id: str, consensus_signature: str) -> str:
    return hashlib.sha256(f"{state_id}|{consensus_signature}".encode()).hexdigest()[:20]


def _teacher_answers(rows: list[dict], stats: dict[str, int]) -> dict[str, tuple[Action, str]]:
    """One (action, call_id) per teacher: its latest answered row with a parseable action."""
    best: dict[str, tuple[str, Action, str]] = {}
    for r in rows:
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
            best[r["teacher"]] = (key, action, r["call_id"])
    return {t: (a, cid) for t, (_, a, cid) in best.items()}


def _renderer(states: pa.Table, messages: pa.Table, render_opts):
    from composer_pipeline import render

    opts = render_opts if render_opts is not None else render.RenderOptions()
    conv = render.Conversation.from_table(messages)

    def _render(state_row: dict) -> tuple[str, str, int]:
        rs = render.render_state(conv, state_row, opts)
        return orjson.dumps(rs.messages).decode(), orjson.dumps(rs.tools).decode(), len(rs.messages)

    return _render


def build_pairs(
    states: pa.Table, messages: pa.Table, replays: pa.Table, recipe: PairRecipe | None = None, render_opts=None
) -> PairsResult:
    """Compare teachers with each other and with the agent; see the module docstring."""
    recipe = recipe or PairRecipe()
    rules = recipe.signature
    stats: dict[str, int] = {
        k: 0
        for k in (
            "states",
            "states_without_replays",
            "states_bad_agent_action",
            "states_too_few_teachers",
            "states_no_consensus",
            "states_tied",
            "states_error_skipped",
            "states_no_messages",
            "states_render_error",
            "replays_not_answered",
            "replays_bad_action_json",
            "replays_empty_action",
            "replays_unknown_state",
            "pairs",
            "positives",
        )
    }
    by_state: dict[str, list[dict]] = {}
    state_ids = set(states.column("state_id").to_pylist()) if states.num_rows else set()
    for r in replays.to_pylist():
        if r["state_id"] not in state_ids:
            stats["replays_unknown_state"] += 1
            continue
        by_state.setdefault(r["state_id"], []).append(r)

    pref = {t: i for i, t in enumerate(recipe.teacher_preference)}
    render_fn = None
    pair_rows: list[dict] = []
    pos_rows: list[dict] = []
    for st in states.to_pylist():
        stats["states"] += 1
        rows = by_state.get(st["state_id"])
        if not rows:
            stats["states_without_replays"] += 1
            continue
        if st.get("has_error") and not recipe.keep_error_states:
            stats["states_error_skipped"] += 1
            continue
        try:
            agent = Action.from_json(st["action"])
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            stats["states_bad_agent_action"] += 1
            continue
        if agent.is_empty:
            stats["states_bad_agent_action"] += 1
            continue
        answers = _teacher_answers(rows, stats)
        n_teachers = len(answers)
        if n_teachers < max(recipe.min_teachers, recipe.agreement_threshold):
            stats["states_too_few_teachers"] += 1
            continue
        groups = group_actions(sorted((t, a) for t, (a, _) in answers.items()), rules)
        top = groups[0]
        n_agreeing = len(top.members)
        score = n_agreeing / n_teachers
        if n_agreeing < recipe.agreement_threshold or score < recipe.min_agreement_score:
            stats["states_no_consensus"] += 1
            continue
        if len(groups) > 1 and len(groups[1].members) == n_agreeing and not recipe.allow_ties:
            stats["states_tied"] += 1
            continue
        members = sorted(top.members, key=lambda t: (pref.get(t, len(pref)), t))
        chosen = answers[members[0]][0]
        agrees = same_decision(agent, top.representative, rules)
        if render_fn is None:
            render_fn = _renderer(states, messages, render_opts)
        try:
            prompt, tools_json, n_msgs = render_fn(st)
        except Exception:  # noqa: BLE001 - one unrenderable state must not sink the run; counted
            stats["states_render_error"] += 1
            continue
        if n_msgs <= 1:  # only the system prompt: the state's stream is not in trace_messages
            stats["states_no_messages"] += 1
            continue
        call_ids = sorted(r["call_id"] for r in rows)
        row = {
            "pair_id": pair_id_for(st["state_id"], top.signature),
            "kind": "positive" if agrees else "pair",
            "state_id": st["state_id"],
            "session_key": st["session_key"],
            "session_id": st.get("session_id"),
            "source_file": st.get("source_file"),
            "source_lines": st.get("source_lines") or [],
            "record_uuids": st.get("record_uuids") or [],
            "replay_call_ids": call_ids,
            "prompt": prompt,
            "tools": tools_json,
            "chosen": chosen.to_json(),
            "rejected": agent.to_json(),
            "chosen_text": chosen.to_text(),
            "rejected_text": agent.to_text(),
            "n_teachers": n_teachers,
            "n_agreeing": n_agreeing,
            "agreeing_teachers": members,
            "agreement_score": score,
            "consensus_signature": top.signature,
            "agent_signature": action_signature(agent, rules),
            "cost_usd": float(sum(r.get("cost_usd") or 0.0 for r in rows)),
            "has_error": bool(st.get("has_error")),
            "error_after": st.get("error_after"),
        }
        (pos_rows if agrees else pair_rows).append(row)
    stats["pairs"], stats["positives"] = len(pair_rows), len(pos_rows)
    return PairsResult(
        pairs=_to_table(pair_rows, "dpo_pairs"),
        positives=_to_table(pos_rows, "agreement_positives"),
        stats=stats,
    )


def _to_table(rows: list[dict], name: str) -> pa.Table:
    schema = tables.SCHEMAS[name]
    if not rows:
        return schema.empty_table()
    return pa.Table.from_pylist(rows, schema=schema)
