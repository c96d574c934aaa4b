"""What ``show`` shows: the rows behind a state or a pair, read from the stores into typed views.

In:  one or more stores (:class:`~composer_pipeline.stores.Stores`: local dirs or ``s3://``, flat or
     partitioned layout) holding ``trace_states`` + ``trace_messages`` (ingest), and when present
     ``teacher_replays`` (replay) and the pair tables (pairs); ids = state ids, pair ids (full, or a
     unique prefix of at least 6 characters) or a session (its session key, or the short partition key
     the Dagster UI shows), resolved by :mod:`composer_pipeline.ids` as ``lineage`` does; render options
     (the ``render:`` section of ``recipes/ingest.yaml``); optionally a teachers YAML to check each
     replay row against the prefix.
Out: :func:`gather` -> :class:`StateView` / :class:`PairView` per id; :meth:`to_dict` is one line of
     ``show --json`` (and :meth:`from_dict` reads it back). For tables already in memory (Dagster
     assets), :func:`state_views` and :func:`pair_views` build the views without a store.

``prefix`` comes from :func:`composer_pipeline.replay.requests.render_prompt`, the very function replay
builds every teacher request from, so with the same render options it IS the ``messages`` the
teachers were sent. Given the teachers YAML, each replay row is checked: the request body rebuilt from
the shown prefix must hash to the row's ``call_id`` (``sent_as_shown``), otherwise the view says so.

Deliberately simplified: tables are read whole and filtered in memory (fine to a few million rows);
per teacher only its latest replay row is shown (older rows are counted in ``superseded``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson
import pyarrow as pa

from composer_pipeline import ids as ids_mod
from composer_pipeline.actions import Action
from composer_pipeline.render import Conversation, RenderOptions
from composer_pipeline.replay.requests import make_request, render_prompt
from composer_pipeline.store import Store
from composer_pipeline.stores import Stores, rows_where

# where a pair can live, and what that says
from composer_pipeline.tables import PAIR_AGREEMENT_FIELDS, PAIR_TABLES

_STATE_META = (
    "session_key",
    "session_id",
    "stream_id",
    "stream_kind",
    "agent_id",
    "parent_tool_use_id",
    "record_uuids",
    "model",
    "version",
    "timestamp",
    "has_error",
)


class ShowError(ValueError):
    """An id that does not resolve (unknown, ambiguous, too short); the CLI exits 2 with the message."""


# --- records ---------------------------------------------------------------------------------
@dataclass
class TeacherAnswer:
    """One teacher's latest ``teacher_replays`` row for a state."""

    teacher: str
    model: str | None
    status: str | None
    reason: str | None
    # Action.to_dict(), None if unanswered or unparseable
    action: dict | None
    raw_answer: str | None
    cost_usd: float | None
    latency_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    attempts: int | None
    cache_hit: bool | None
    call_id: str | None
    created_at: str | None
    # older rows of this teacher for this state
    superseded: int = 0
    # call_id == hash of the body rebuilt from the shown prefix (needs teachers YAML)
    sent_as_shown: bool | None = None
    paid_usd: float | None = (
        # what the run that wrote the row paid (0 for a cache hit); cost_usd = cost when bought
        None
    )
    # prompt tokens the provider billed as cache reads (cost_usd is the billed price)
    cached_tokens: int | None = None
    # messages of the prefix elided to fit the teacher's window before its answer
    elided_messages: int = 0


@dataclass
class StateView:
    state_id: str
    source_file: str | None
    source_lines: list[int]
    # OpenAI chat messages, exactly as replay sends them
    prefix: list[dict]
    tools: list[dict]
    action: dict  # the agent's Action.to_dict()
    error_after: list[dict] | None
    teachers: list[TeacherAnswer] = field(default_factory=list)
    # session_key, stream_id, stream_kind, model, ...
    meta: dict[str, Any] = field(default_factory=dict)
    render: dict[str, Any] = field(default_factory=dict)  # the render options used
    replayed: bool = False
    missing: list[str] = field(default_factory=list)  # links that could not be followed

    kind = "state"

    def to_dict(self) -> dict[str, Any]:
        d = {
            "kind": "state",
            "state_id": self.state_id,
            "source_file": self.source_file,
            "source_lines": list(self.source_lines),
            **self.meta,
            "render": self.render,
            "prefix": self.prefix,
            "tools": self.tools,
            "action": self.action,
            "error_after": self.error_after,
            "replayed": self.replayed,
            "teachers": [asdict(t) for t in self.teachers],
            "missing": list(self.missing),
        }
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StateView:
        return cls(
            state_id=d["state_id"],
            source_file=d.get("source_file"),
            source_lines=list(d.get("source_lines") or []),
            prefix=d.get("prefix") or [],
            tools=d.get("tools") or [],
            action=d.get("action") or {},
            error_after=d.get("error_after"),
            teachers=[TeacherAnswer(**t) for t in d.get("teachers") or []],
            meta={k: d[k] for k in _STATE_META if k in d},
            render=d.get("render") or {},
            replayed=bool(d.get("replayed")),
            missing=list(d.get("missing") or []),
        )


@dataclass
class PairView:
    pair_id: str
    pair_kind: str | None  # pair | positive (None: not recorded)
    # [{"table", "status"[, "drop_op", "drop_reason"]}]
    tables: list[dict]
    chosen: dict
    rejected: dict
    # n_teachers, n_agreeing, agreeing_teachers, agreement_score, signatures, cost
    agreement: dict[str, Any]
    state: StateView
    # the pair's stored prompt == the prefix rendered now
    prompt_matches_prefix: bool | None = None
    # the stored chosen/rejected_text (what the trainer reads) == the actions in render.action_order now;
    # not in to_dict (the JSON carries the texts themselves)
    texts_match_order: bool | None = None

    kind = "pair"

    def to_dict(self) -> dict[str, Any]:
        d = self.state.to_dict()
        d.update(
            {
                "kind": "pair",
                "pair_id": self.pair_id,
                "pair_kind": self.pair_kind,
                "pair_tables": self.tables,
                "chosen": self.chosen,
                "rejected": self.rejected,
                **self.agreement,
                "prompt_matches_prefix": self.prompt_matches_prefix,
            }
        )
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PairView:
        return cls(
            pair_id=d["pair_id"],
            pair_kind=d.get("pair_kind"),
            tables=d.get("pair_tables") or [],
            chosen=d.get("chosen") or {},
            rejected=d.get("rejected") or {},
            agreement={k: d[k] for k in PAIR_AGREEMENT_FIELDS if k in d},
            state=StateView.from_dict(d),
            prompt_matches_prefix=d.get("prompt_matches_prefix"),
        )


View = StateView | PairView


def view_from_dict(d: dict[str, Any]) -> View:
    """Read back one ``show --json`` line (as a dict)."""
    return PairView.from_dict(d) if d.get("kind") == "pair" else StateView.from_dict(d)


def to_json_line(view: View) -> str:
    return orjson.dumps(view.to_dict()).decode()


# --- gathering ---------------------------------------------------------------------------------
def _loads(s: str | None) -> Any:
    return orjson.loads(s) if s else None


def _teacher_answers(rows: list[dict], prefer_call_ids: Sequence[str] = ()) -> list[TeacherAnswer]:
    """Latest row per teacher (rows named in ``prefer_call_ids`` win: they are the ones a pair used)."""
    prefer = set(prefer_call_ids)
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["teacher"], []).append(r)
    out = []
    for teacher in sorted(by):
        rs = sorted(by[teacher], key=lambda r: ((r.get("call_id") in prefer), r.get("created_at") or ""))
        r = rs[-1]
        try:
            action = _loads(r.get("action"))
        except orjson.JSONDecodeError:
            action = None
        out.append(
            TeacherAnswer(
                teacher=teacher,
                model=r.get("model"),
                status=r.get("status"),
                reason=r.get("reason"),
                action=action,
                raw_answer=r.get("raw_answer"),
                cost_usd=r.get("cost_usd"),
                latency_s=r.get("latency_s"),
                prompt_tokens=r.get("prompt_tokens"),
                completion_tokens=r.get("completion_tokens"),
                attempts=r.get("attempts"),
                cache_hit=r.get("cache_hit"),
                call_id=r.get("call_id"),
                created_at=r.get("created_at"),
                superseded=len(rs) - 1,
                paid_usd=r.get("paid_usd"),
                cached_tokens=r.get("cached_tokens"),
                elided_messages=int(r.get("elided_messages") or 0),
            )
        )
    return out


def _verify(view: StateView, teachers_config) -> None:
    """Set ``sent_as_shown``: does the body rebuilt from the shown prefix hash to the row's call_id?"""

    cfg = {t.name: t for t in teachers_config.teachers}
    for ans in view.teachers:
        t = cfg.get(ans.teacher)
        if t is None or not ans.call_id:
            continue
        req = make_request(view.state_id, None, t, view.prefix, view.tools)
        ans.sent_as_shown = req.call_id == ans.call_id


def _state_view(
    conv: Conversation,
    st: dict,
    opts: RenderOptions,
    replay_rows: list[dict] | None,
    prefer_call_ids: Sequence[str] = (),
) -> StateView:
    rs = render_prompt(conv, st, opts)
    missing = []
    if st["stream_id"] not in conv.streams:
        missing.append(f"trace_messages: stream {st['stream_id']} not stored (prefix holds the system prompt only)")
    try:
        action = _loads(st.get("action")) or {}
    except orjson.JSONDecodeError:
        action = {}
        missing.append("trace_states: action is not valid JSON")
    return StateView(
        state_id=st["state_id"],
        source_file=st.get("source_file"),
        source_lines=list(st.get("source_lines") or []),
        prefix=rs.messages,
        tools=rs.tools,
        action=action,
        error_after=_loads(st.get("error_after")),
        teachers=_teacher_answers(replay_rows or [], prefer_call_ids),
        meta={k: st.get(k) for k in _STATE_META},
        render={"compaction": opts.compaction, "strip_thinking": opts.strip_thinking},
        replayed=bool(replay_rows),
        missing=missing,
    )


def state_views(
    states: pa.Table,
    messages: pa.Table,
    replays: pa.Table | None = None,
    opts: RenderOptions | None = None,
    state_ids: Sequence[str] | None = None,
) -> list[StateView]:
    """Views of ``state_ids`` (default: every state) from tables already in memory (Dagster assets)."""
    opts = opts or RenderOptions()
    if state_ids is not None:
        states = rows_where(states, "state_id", state_ids)
    rows = states.to_pylist()
    conv = Conversation.from_table(rows_where(messages, "stream_id", sorted({r["stream_id"] for r in rows})))
    by_state: dict[str, list[dict]] = {}
    if replays is not None:
        for r in rows_where(replays, "state_id", [r["state_id"] for r in rows]).to_pylist():
            by_state.setdefault(r["state_id"], []).append(r)
    return [_state_view(conv, st, opts, by_state.get(st["state_id"])) for st in rows]


def pair_views(
    pairs: pa.Table,
    states: pa.Table | None,
    messages: pa.Table | None,
    replays: pa.Table | None = None,
    opts: RenderOptions | None = None,
    table: str = "dpo_pairs",
    pair_ids: Sequence[str] | None = None,
) -> list[PairView]:
    """Views of the pairs in ``table`` (default: every row; ``pair_ids`` to pick) from tables already in
    memory (Dagster assets). Without ``states`` a view shows the prompt the pair stored."""
    opts = opts or RenderOptions()
    rows = (rows_where(pairs, "pair_id", pair_ids) if pair_ids is not None else pairs).to_pylist()
    need = sorted({r["state_id"] for r in rows})
    st_rows = {r["state_id"]: r for r in rows_where(states, "state_id", need).to_pylist()} if states is not None else {}
    streams = sorted({r["stream_id"] for r in st_rows.values()})
    conv = (
        Conversation.from_table(rows_where(messages, "stream_id", streams)) if messages is not None else Conversation()
    )
    by_state: dict[str, list[dict]] = {}
    if replays is not None:
        for r in rows_where(replays, "state_id", need).to_pylist():
            by_state.setdefault(r["state_id"], []).append(r)
    app = {"table": table, "status": dict(PAIR_TABLES).get(table, table)}
    views = [_pair_view((row, [dict(app)]), st_rows, conv, opts, by_state, messages is not None) for row in rows]
    # the caller chose the pair's stored prompt (render source "pair.prompt"): nothing is missing
    if states is None:
        for v in views:
            v.state.missing = [m for m in v.state.missing if not m.startswith("trace_states: state ")]
    return views


def resolve_ids(
    ids: Sequence[str],
    state_ids: Sequence[str],
    pair_ids: Sequence[str],
    where: str,
    sessions: Mapping[str, Sequence[str]] | None = None,
) -> list[tuple[str, str]]:
    """Each id -> ("state" | "pair", full id): exact match, else a unique prefix of >= 6 chars
    (:func:`composer_pipeline.ids.resolve_id`, as ``lineage``). With ``sessions`` (session key -> its
    state ids), a session key or the short partition key the UI shows (``calc/a1f0c3d2``) names every
    state of that session."""
    sset, pset = set(state_ids), set(pair_ids)
    out: list[tuple[str, str]] = []
    sessions = sessions or {}
    for raw in ids:
        session = ids_mod.session_of(raw, sessions, where, ShowError) if sessions else None
        if session is not None:
            out += [("state", s) for s in sessions[session]]
            continue
        out.append(ids_mod.resolve_id(raw, {"state": sset, "pair": pset}, where, ShowError))
    return out


def gather(
    store: Stores | Store | str | Sequence[Store | str],
    ids: Sequence[str] = (),
    *,
    all_states: bool = False,
    opts: RenderOptions | None = None,
    teachers_config=None,
) -> Iterator[View]:
    """One view per id (or per stored state with ``all_states``), in the order asked."""
    stores = Stores.of(store)
    where = stores.where
    opts = opts or RenderOptions()
    states = stores.read("trace_states")
    pair_tables = [(name, status, t) for name, status in PAIR_TABLES if (t := stores.read(name)) is not None]
    if states is None and not pair_tables:
        raise FileNotFoundError(f"no trace_states or pair tables under {where} (run `composer-pipeline ingest` first)")
    targets = _targets(states, pair_tables, ids, all_states, where)
    want_pairs = [i for k, i in targets if k == "pair"]
    pairs = _pair_rows(pair_tables, want_pairs)

    need_states = {i for k, i in targets if k == "state"} | {pairs[p][0]["state_id"] for p in want_pairs}
    st_rows = (
        {r["state_id"]: r for r in rows_where(states, "state_id", sorted(need_states)).to_pylist()}
        if states is not None
        else {}
    )
    messages = stores.read("trace_messages")
    streams = sorted({r["stream_id"] for r in st_rows.values()})
    conv = (
        Conversation.from_table(rows_where(messages, "stream_id", streams)) if messages is not None else Conversation()
    )
    replays = stores.read("teacher_replays")
    by_state = _replays_by_state(replays, need_states)

    for kind, ident in targets:
        if kind == "state":
            state_view = _state_view(conv, st_rows[ident], opts, by_state.get(ident))
            if messages is None:
                state_view.missing.append("trace_messages: table not stored")
            view: View = state_view
        else:
            view = _pair_view(pairs[ident], st_rows, conv, opts, by_state, messages is not None)
        if replays is None:
            view_state = view.state if isinstance(view, PairView) else view
            view_state.missing.append("teacher_replays: table not stored (not replayed yet)")
        if teachers_config is not None:
            _verify(view.state if isinstance(view, PairView) else view, teachers_config)
        yield view


def _targets(states, pair_tables: list, ids: Sequence[str], all_states: bool, where: str) -> list[tuple[str, str]]:
    """``(kind, id)`` to show: every stored state with ``all_states``, else ``ids`` resolved (prefixes,
    session keys) against the stored state and pair ids."""
    if all_states:
        if states is None:
            raise FileNotFoundError(f"no trace_states under {where} (run `composer-pipeline ingest` first)")
        return [("state", s) for s in states.column("state_id").to_pylist()]
    pair_ids = sorted({p for _, _, t in pair_tables for p in t.column("pair_id").to_pylist() if p})
    sessions: dict[str, list[str]] = {}
    if states is not None:
        for sk, sid in zip(states.column("session_key").to_pylist(), states.column("state_id").to_pylist()):
            sessions.setdefault(sk, []).append(sid)
    state_ids = states.column("state_id").to_pylist() if states is not None else []
    return resolve_ids(ids, state_ids, pair_ids, where, sessions)


def _pair_rows(pair_tables: list, want_pairs: list[str]) -> dict[str, tuple[dict, list[dict]]]:
    """The pair rows asked for: the first table in PAIR_TABLES order gives the row; every appearance is listed."""
    pairs: dict[str, tuple[dict, list[dict]]] = {}
    for name, status, t in pair_tables:
        for row in rows_where(t, "pair_id", want_pairs).to_pylist() if want_pairs else []:
            app = {"table": name, "status": status}
            if name == "dropped_pairs":
                app.update(drop_op=row.get("drop_op"), drop_reason=row.get("drop_reason"))
            if row["pair_id"] in pairs:
                if app not in pairs[row["pair_id"]][1]:
                    pairs[row["pair_id"]][1].append(app)
            else:
                pairs[row["pair_id"]] = (row, [app])
    return pairs


def _replays_by_state(replays, need_states: set[str]) -> dict[str, list[dict]]:
    by_state: dict[str, list[dict]] = {}
    if replays is not None:
        for r in rows_where(replays, "state_id", sorted(need_states)).to_pylist():
            by_state.setdefault(r["state_id"], []).append(r)
    return by_state


def _pair_view(
    entry: tuple[dict, list[dict]],
    st_rows: dict,
    conv: Conversation,
    opts: RenderOptions,
    by_state: dict,
    have_messages: bool,
) -> PairView:
    row, apps = entry
    call_ids = list(row.get("replay_call_ids") or [])
    st = st_rows.get(row["state_id"])
    stored_prompt = _loads(row.get("prompt"))
    if st is not None:
        sv = _state_view(conv, st, opts, by_state.get(row["state_id"]), call_ids)
        if not have_messages:
            sv.missing.append("trace_messages: table not stored")
        match = stored_prompt == sv.prefix if stored_prompt is not None else None
    # the state is not stored here: show what the pair itself recorded
    else:
        sv = StateView(
            state_id=row["state_id"],
            source_file=row.get("source_file"),
            source_lines=list(row.get("source_lines") or []),
            prefix=stored_prompt or [],
            tools=_loads(row.get("tools")) or [],
            action=_loads(row.get("rejected")) or {},
            error_after=_loads(row.get("error_after")),
            teachers=_teacher_answers(by_state.get(row["state_id"]) or [], call_ids),
            meta={
                "session_key": row.get("session_key"),
                "session_id": row.get("session_id"),
                "has_error": row.get("has_error"),
                "record_uuids": row.get("record_uuids"),
            },
            render={"source": "pair.prompt"},
            replayed=bool(by_state.get(row["state_id"])),
            missing=[f"trace_states: state {row['state_id']} not stored (prefix is the pair's stored prompt)"],
        )
        match = None
    return PairView(
        pair_id=row["pair_id"],
        pair_kind=row.get("kind"),
        tables=apps,
        chosen=_loads(row.get("chosen")) or {},
        rejected=_loads(row.get("rejected")) or {},
        agreement={k: row.get(k) for k in PAIR_AGREEMENT_FIELDS},
        state=sv,
        prompt_matches_prefix=match,
        texts_match_order=_texts_match_order(row, opts),
    )


def _texts_match_order(row: dict, opts: RenderOptions) -> bool | None:
    """Whether a pair's stored texts are its actions' text form in ``opts.action_order`` (None: unreadable)."""
    try:
        chosen, rejected = Action.from_json(row.get("chosen") or "{}"), Action.from_json(row.get("rejected") or "{}")
    except (ValueError, KeyError, TypeError):
        return None
    order = opts.action_order
    return (row.get("chosen_text"), row.get("rejected_text")) == (chosen.to_text(order), rejected.to_text(order))
