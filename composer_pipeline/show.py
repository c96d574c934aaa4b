"""Audit views: what the agent saw at a step, what it did, and what each teacher saw and answered.

In:  one or more :class:`~composer_pipeline.store.Store` (local dir or ``s3://``, flat or partitioned
     layout) holding ``trace_states`` + ``trace_messages`` (ingest), and when present
     ``teacher_replays`` (replay) and the pair tables (pairs); ids = state ids or pair ids (full, or a
     unique prefix of at least 6 characters); render options (the ``render:`` section of
     ``recipes/ingest.yaml``); optionally a teachers YAML to check each replay row against the prefix.
Out: :func:`gather` -> :class:`StateView` / :class:`PairView` per id; :meth:`to_dict` is one line of
     ``show --json`` (and :meth:`from_dict` reads it back); :func:`format_view` is the terminal view;
     :func:`render_markdown` the same view in Markdown (Dagster asset metadata). For tables already in
     memory, :func:`state_views` and :func:`pair_views` build the views without a store.

``prefix`` comes from :func:`composer_pipeline.teachers.replay.render_prompt`, the very function replay
builds every teacher request from, so with the same render options it IS the ``messages`` the
teachers were sent. Given the teachers YAML, each replay row is checked: the request body rebuilt from
the shown prefix must hash to the row's ``call_id`` (``sent_as_shown``), otherwise the view says so.

Deliberately simplified: tables are read whole and filtered in memory (fine to a few million rows);
per teacher only its latest replay row is shown (older rows are counted in ``superseded``).
"""

from __future__ import annotations

import shutil
import textwrap
from dataclasses import asdict, dataclass, field
from itertools import zip_longest
from typing import Any, Iterator, Mapping, Sequence

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from composer_pipeline.pairs.build import agreement_label
from composer_pipeline import ids as ids_mod
from composer_pipeline.ids import MIN_PREFIX
from composer_pipeline.lineage import PAIR_TABLES  # where a pair can live, and what that says
from composer_pipeline.render import INTERRUPTED, Conversation, RenderOptions, flatten_content
from composer_pipeline.store import Store

_STATE_META = ("session_key", "session_id", "stream_id", "stream_kind", "agent_id", "parent_tool_use_id",
               "record_uuids", "model", "version", "timestamp", "has_error")
_AGREEMENT = ("agreement_kind", "n_teachers", "n_models", "n_models_agreeing", "n_agreeing", "agreeing_teachers", "agreement_score", "consensus_signature",
              "agent_signature", "cost_usd", "chosen_text", "rejected_text")


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
    action: dict | None  # Action.to_dict(), None if unanswered or unparseable
    raw_answer: str | None
    cost_usd: float | None
    latency_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    attempts: int | None
    cache_hit: bool | None
    call_id: str | None
    created_at: str | None
    superseded: int = 0  # older rows of this teacher for this state
    sent_as_shown: bool | None = None  # call_id == hash of the body rebuilt from the shown prefix (needs teachers YAML)
    paid_usd: float | None = None  # what the run that wrote the row paid (0 for a cache hit); cost_usd = cost when bought
    cached_tokens: int | None = None  # prompt tokens the provider billed as cache reads (cost_usd is the billed price)
    elided_messages: int = 0  # messages of the prefix elided to fit the teacher's window before its answer


@dataclass
class StateView:
    state_id: str
    source_file: str | None
    source_lines: list[int]
    prefix: list[dict]  # OpenAI chat messages, exactly as replay sends them
    tools: list[dict]
    action: dict  # the agent's Action.to_dict()
    error_after: list[dict] | None
    teachers: list[TeacherAnswer] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)  # session_key, stream_id, stream_kind, model, ...
    render: dict[str, Any] = field(default_factory=dict)  # the render options used
    replayed: bool = False
    missing: list[str] = field(default_factory=list)  # links that could not be followed

    kind = "state"

    def to_dict(self) -> dict[str, Any]:
        d = {"kind": "state", "state_id": self.state_id, "source_file": self.source_file,
             "source_lines": list(self.source_lines), **self.meta, "render": self.render, "prefix": self.prefix,
             "tools": self.tools, "action": self.action, "error_after": self.error_after, "replayed": self.replayed,
             "teachers": [asdict(t) for t in self.teachers], "missing": list(self.missing)}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StateView":
        return cls(
            state_id=d["state_id"], source_file=d.get("source_file"), source_lines=list(d.get("source_lines") or []),
            prefix=d.get("prefix") or [], tools=d.get("tools") or [], action=d.get("action") or {},
            error_after=d.get("error_after"), teachers=[TeacherAnswer(**t) for t in d.get("teachers") or []],
            meta={k: d[k] for k in _STATE_META if k in d}, render=d.get("render") or {},
            replayed=bool(d.get("replayed")), missing=list(d.get("missing") or []),
        )


@dataclass
class PairView:
    pair_id: str
    pair_kind: str  # pair | positive
    tables: list[dict]  # [{"table", "status"[, "drop_op", "drop_reason"]}]
    chosen: dict
    rejected: dict
    agreement: dict[str, Any]  # n_teachers, n_agreeing, agreeing_teachers, agreement_score, signatures, cost
    state: StateView
    prompt_matches_prefix: bool | None = None  # the pair's stored prompt == the prefix rendered now

    kind = "pair"

    def to_dict(self) -> dict[str, Any]:
        d = self.state.to_dict()
        d.update({"kind": "pair", "pair_id": self.pair_id, "pair_kind": self.pair_kind, "pair_tables": self.tables,
                  "chosen": self.chosen, "rejected": self.rejected, **self.agreement,
                  "prompt_matches_prefix": self.prompt_matches_prefix})
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PairView":
        return cls(pair_id=d["pair_id"], pair_kind=d.get("pair_kind"), tables=d.get("pair_tables") or [],
                   chosen=d.get("chosen") or {}, rejected=d.get("rejected") or {},
                   agreement={k: d[k] for k in _AGREEMENT if k in d}, state=StateView.from_dict(d),
                   prompt_matches_prefix=d.get("prompt_matches_prefix"))


View = StateView | PairView


def view_from_dict(d: dict[str, Any]) -> View:
    """Read back one ``show --json`` line (as a dict)."""
    return PairView.from_dict(d) if d.get("kind") == "pair" else StateView.from_dict(d)


def to_json_line(view: View) -> str:
    return orjson.dumps(view.to_dict()).decode()


# --- gathering ---------------------------------------------------------------------------------
def _loads(s: str | None) -> Any:
    return orjson.loads(s) if s else None


def _concat(stores: Sequence[Store], name: str) -> pa.Table | None:
    parts = [s.read_table(name) for s in stores if s.exists(name)]
    if not parts:
        return None
    return pa.concat_tables(parts, promote_options="default") if len(parts) > 1 else parts[0]


def _filter(t: pa.Table | None, column: str, values: Sequence[str]) -> pa.Table | None:
    if t is None or not values:
        return t if t is None else t.slice(0, 0)
    mask = pc.is_in(t.column(column), pa.array(list(values), t.column(column).type))
    return t.filter(pc.fill_null(mask, False))


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
        out.append(TeacherAnswer(
            teacher=teacher, model=r.get("model"), status=r.get("status"), reason=r.get("reason"), action=action,
            raw_answer=r.get("raw_answer"), cost_usd=r.get("cost_usd"), latency_s=r.get("latency_s"),
            prompt_tokens=r.get("prompt_tokens"), completion_tokens=r.get("completion_tokens"),
            attempts=r.get("attempts"), cache_hit=r.get("cache_hit"), call_id=r.get("call_id"),
            created_at=r.get("created_at"), superseded=len(rs) - 1, paid_usd=r.get("paid_usd"),
            cached_tokens=r.get("cached_tokens"), elided_messages=int(r.get("elided_messages") or 0),
        ))
    return out


def _verify(view: StateView, teachers_config) -> None:
    """Set ``sent_as_shown``: does the body rebuilt from the shown prefix hash to the row's call_id?"""
    from composer_pipeline.teachers.replay import make_request

    cfg = {t.name: t for t in teachers_config.teachers}
    for ans in view.teachers:
        t = cfg.get(ans.teacher)
        if t is None or not ans.call_id:
            continue
        req = make_request(view.state_id, None, t, view.prefix, view.tools)
        ans.sent_as_shown = req.call_id == ans.call_id


def _state_view(conv: Conversation, st: dict, opts: RenderOptions, replay_rows: list[dict] | None,
                prefer_call_ids: Sequence[str] = ()) -> StateView:
    from composer_pipeline.teachers.replay import render_prompt

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
        state_id=st["state_id"], source_file=st.get("source_file"), source_lines=list(st.get("source_lines") or []),
        prefix=rs.messages, tools=rs.tools, action=action, error_after=_loads(st.get("error_after")),
        teachers=_teacher_answers(replay_rows or [], prefer_call_ids),
        meta={k: st.get(k) for k in _STATE_META}, render={"compaction": opts.compaction, "strip_thinking": opts.strip_thinking},
        replayed=bool(replay_rows), missing=missing,
    )


def state_views(states: pa.Table, messages: pa.Table, replays: pa.Table | None = None,
                opts: RenderOptions | None = None, state_ids: Sequence[str] | None = None) -> list[StateView]:
    """Views of ``state_ids`` (default: every state) from tables already in memory (Dagster assets)."""
    opts = opts or RenderOptions()
    if state_ids is not None:
        states = _filter(states, "state_id", state_ids)
    rows = states.to_pylist()
    conv = Conversation.from_table(_filter(messages, "stream_id", sorted({r["stream_id"] for r in rows})))
    by_state: dict[str, list[dict]] = {}
    if replays is not None:
        for r in _filter(replays, "state_id", [r["state_id"] for r in rows]).to_pylist():
            by_state.setdefault(r["state_id"], []).append(r)
    return [_state_view(conv, st, opts, by_state.get(st["state_id"])) for st in rows]


def pair_views(pairs: pa.Table, states: pa.Table | None, messages: pa.Table | None, replays: pa.Table | None = None,
               opts: RenderOptions | None = None, table: str = "dpo_pairs",
               pair_ids: Sequence[str] | None = None) -> list[PairView]:
    """Views of the pairs in ``table`` (default: every row; ``pair_ids`` to pick) from tables already in
    memory (Dagster assets). Without ``states`` a view shows the prompt the pair stored."""
    opts = opts or RenderOptions()
    rows = (_filter(pairs, "pair_id", pair_ids) if pair_ids is not None else pairs).to_pylist()
    need = sorted({r["state_id"] for r in rows})
    st_rows = {r["state_id"]: r for r in _filter(states, "state_id", need).to_pylist()} if states is not None else {}
    streams = sorted({r["stream_id"] for r in st_rows.values()})
    conv = Conversation.from_table(_filter(messages, "stream_id", streams)) if messages is not None else Conversation()
    by_state: dict[str, list[dict]] = {}
    if replays is not None:
        for r in _filter(replays, "state_id", need).to_pylist():
            by_state.setdefault(r["state_id"], []).append(r)
    app = {"table": table, "status": dict(PAIR_TABLES).get(table, table)}
    views = [_pair_view((row, [dict(app)]), st_rows, conv, opts, by_state, messages is not None) for row in rows]
    if states is None:  # the caller chose the pair's stored prompt (render source "pair.prompt"): nothing is missing
        for v in views:
            v.state.missing = [m for m in v.state.missing if not m.startswith("trace_states: state ")]
    return views


def _stores(store: Store | str | Sequence[Store | str]) -> list[Store]:
    items = [store] if isinstance(store, (Store, str)) else list(store)
    return [s if isinstance(s, Store) else Store(s) for s in items]


def resolve_ids(ids: Sequence[str], state_ids: Sequence[str], pair_ids: Sequence[str], where: str,
                sessions: Mapping[str, Sequence[str]] | None = None) -> list[tuple[str, str]]:
    """Each id -> ("state" | "pair", full id): exact match, else a unique prefix of >= 6 chars
    (:func:`composer_pipeline.ids.resolve_id`, as ``lineage``). With ``sessions`` (session key -> its
    state ids), a session key or the short partition key the UI shows (``calc/a1f0c3d2``) names every
    state of that session."""
    sset, pset = set(state_ids), set(pair_ids)
    out: list[tuple[str, str]] = []
    for raw in ids:
        session = ids_mod.session_of(raw, sessions or {}, where, ShowError) if sessions else None
        if session is not None:
            out += [("state", s) for s in sessions[session]]
            continue
        out.append(ids_mod.resolve_id(raw, {"state": sset, "pair": pset}, where, ShowError))
    return out


def gather(store: Store | str | Sequence[Store | str], ids: Sequence[str] = (), *, all_states: bool = False,
           opts: RenderOptions | None = None, teachers_config=None) -> Iterator[View]:
    """One view per id (or per stored state with ``all_states``), in the order asked."""
    stores = _stores(store)
    where = ", ".join(s.root for s in stores)
    opts = opts or RenderOptions()
    states = _concat(stores, "trace_states")
    pair_tables = [(name, status, t) for name, status in PAIR_TABLES if (t := _concat(stores, name)) is not None]
    if states is None and not pair_tables:
        raise FileNotFoundError(f"no trace_states or pair tables under {where} (run `composer-pipeline ingest` first)")
    if all_states:
        if states is None:
            raise FileNotFoundError(f"no trace_states under {where} (run `composer-pipeline ingest` first)")
        targets = [("state", s) for s in states.column("state_id").to_pylist()]
    else:
        pair_ids = sorted({p for _, _, t in pair_tables for p in t.column("pair_id").to_pylist() if p})
        sessions: dict[str, list[str]] = {}
        if states is not None:
            for sk, sid in zip(states.column("session_key").to_pylist(), states.column("state_id").to_pylist()):
                sessions.setdefault(sk, []).append(sid)
        targets = resolve_ids(ids, states.column("state_id").to_pylist() if states is not None else [], pair_ids, where,
                              sessions)

    # the pair rows (first table in PAIR_TABLES order wins; every appearance is listed)
    pairs: dict[str, tuple[dict, list[dict]]] = {}
    want_pairs = [i for k, i in targets if k == "pair"]
    for name, status, t in pair_tables:
        for row in _filter(t, "pair_id", want_pairs).to_pylist() if want_pairs else []:
            app = {"table": name, "status": status}
            if name == "dropped_pairs":
                app.update(drop_op=row.get("drop_op"), drop_reason=row.get("drop_reason"))
            if row["pair_id"] in pairs:
                if app not in pairs[row["pair_id"]][1]:
                    pairs[row["pair_id"]][1].append(app)
            else:
                pairs[row["pair_id"]] = (row, [app])

    need_states = {i for k, i in targets if k == "state"} | {pairs[p][0]["state_id"] for p in want_pairs}
    st_rows = {r["state_id"]: r for r in _filter(states, "state_id", sorted(need_states)).to_pylist()} if states is not None else {}
    messages = _concat(stores, "trace_messages")
    streams = sorted({r["stream_id"] for r in st_rows.values()})
    conv = Conversation.from_table(_filter(messages, "stream_id", streams)) if messages is not None else Conversation()
    replays = _concat(stores, "teacher_replays")
    by_state: dict[str, list[dict]] = {}
    if replays is not None:
        for r in _filter(replays, "state_id", sorted(need_states)).to_pylist():
            by_state.setdefault(r["state_id"], []).append(r)

    for kind, ident in targets:
        if kind == "state":
            view: View = _state_view(conv, st_rows[ident], opts, by_state.get(ident))
            if messages is None:
                view.missing.append("trace_messages: table not stored")
        else:
            view = _pair_view(pairs[ident], st_rows, conv, opts, by_state, messages is not None)
        if replays is None:
            view_state = view.state if isinstance(view, PairView) else view
            view_state.missing.append("teacher_replays: table not stored (not replayed yet)")
        if teachers_config is not None:
            _verify(view.state if isinstance(view, PairView) else view, teachers_config)
        yield view


def _pair_view(entry: tuple[dict, list[dict]], st_rows: dict, conv: Conversation, opts: RenderOptions,
               by_state: dict, have_messages: bool) -> PairView:
    row, apps = entry
    call_ids = list(row.get("replay_call_ids") or [])
    st = st_rows.get(row["state_id"])
    stored_prompt = _loads(row.get("prompt"))
    if st is not None:
        sv = _state_view(conv, st, opts, by_state.get(row["state_id"]), call_ids)
        if not have_messages:
            sv.missing.append("trace_messages: table not stored")
        match = stored_prompt == sv.prefix if stored_prompt is not None else None
    else:  # the state is not stored here: show what the pair itself recorded
        sv = StateView(
            state_id=row["state_id"], source_file=row.get("source_file"), source_lines=list(row.get("source_lines") or []),
            prefix=stored_prompt or [], tools=_loads(row.get("tools")) or [], action=_loads(row.get("rejected")) or {},
            error_after=_loads(row.get("error_after")),
            teachers=_teacher_answers(by_state.get(row["state_id"]) or [], call_ids),
            meta={"session_key": row.get("session_key"), "session_id": row.get("session_id"), "has_error": row.get("has_error"),
                  "record_uuids": row.get("record_uuids")},
            render={"source": "pair.prompt"}, replayed=bool(by_state.get(row["state_id"])),
            missing=[f"trace_states: state {row['state_id']} not stored (prefix is the pair's stored prompt)"],
        )
        match = None
    return PairView(
        pair_id=row["pair_id"], pair_kind=row.get("kind"), tables=apps, chosen=_loads(row.get("chosen")) or {},
        rejected=_loads(row.get("rejected")) or {}, agreement={k: row.get(k) for k in _AGREEMENT},
        state=sv, prompt_matches_prefix=match,
    )


# --- text helpers ------------------------------------------------------------------------------
def _shorten(text: str, max_lines: int, max_chars: int = 240) -> str:
    """First ``max_lines`` lines (each cut at ``max_chars``) and how much was left out; 0 = everything."""
    if not max_lines:
        return text
    lines = text.splitlines() or [""]
    kept = [ln if len(ln) <= max_chars else ln[:max_chars] + "…" for ln in lines[:max_lines]]
    if len(lines) > max_lines:
        kept.append(f"… (+{len(lines) - max_lines} more lines, {len(text)} chars in all)")
    return "\n".join(kept)


def _value(v: Any, limit: int) -> str:
    s = orjson.dumps(v).decode()
    return s if not limit or len(s) <= limit else s[:limit] + f"…[{len(s)} chars]"


def call_text(name: str, arguments: Any, limit: int = 160) -> str:
    """``Name(key=value, ...)`` with JSON values, each cut at ``limit`` chars (0 = never)."""
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return f"{name}({_value(arguments, limit)})"
    if not isinstance(arguments, dict):
        return f"{name}({_value(arguments, limit)})"
    return f"{name}(" + ", ".join(f"{k}={_value(v, limit)}" for k, v in arguments.items()) + ")"


def _action_lines(action: dict | None, limit: int, max_lines: int) -> list[str]:
    if not action:
        return ["(no action)"]
    out = []
    if action.get("thinking"):
        out += ["<thinking> " + ln for ln in _shorten(action["thinking"], max_lines).splitlines()]
    if (action.get("text") or "").strip():
        out += _shorten(action["text"].strip(), max_lines).splitlines()
    for c in action.get("tool_calls") or []:
        out.append(f"→ {call_text(c.get('name', '?'), c.get('arguments'), limit)}" + (f"   [{c['id']}]" if c.get("id") else ""))
    return out or ["(empty action)"]


def _indent(lines: Sequence[str] | str, n: int = 4) -> str:
    if isinstance(lines, str):
        lines = lines.splitlines() or [""]
    return "\n".join(" " * n + ln for ln in lines)


def _tool_names(prefix: list[dict]) -> dict[str, str]:
    return {c.get("id"): (c.get("function") or {}).get("name", "?")
            for m in prefix if m.get("role") == "assistant" for c in m.get("tool_calls") or []}


def _money(v: float | None) -> str:
    return "-" if v is None else f"${v:.6f}"


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


def _lines_span(lines: Sequence[int]) -> str:
    if not lines:
        return "?"
    lo, hi = min(lines), max(lines)
    return f"line {lo}" if lo == hi else f"lines {lo}-{hi}"


def _teacher_flags(t: TeacherAnswer, agreeing: Sequence[str] = ()) -> str:
    flags = []
    if t.cache_hit:
        flags.append("cache hit")
    if t.teacher in agreeing:
        flags.append("agrees")
    if t.superseded:
        flags.append(f"{t.superseded} older row(s)")
    if t.sent_as_shown is True:
        flags.append("sent as shown ✓")
    elif t.sent_as_shown is False:
        flags.append("SENT A DIFFERENT PREFIX (other render options?)")
    return f"  [{', '.join(flags)}]" if flags else ""


def _teacher_summary(ts: Sequence[TeacherAnswer]) -> str:
    by: dict[str, int] = {}
    for t in ts:
        by[t.status or "?"] = by.get(t.status or "?", 0) + 1
    cost = sum(t.cost_usd or 0.0 for t in ts)
    lat = [t.latency_s for t in ts if t.latency_s is not None and not t.cache_hit]
    s = ", ".join(f"{n} {k}" for k, n in sorted(by.items())) + f" · cost {_money(cost)}"
    if lat:
        s += f" · latency mean {sum(lat) / len(lat):.2f} s, max {max(lat):.2f} s"
    return s


# --- terminal view -----------------------------------------------------------------------------
def format_view(view: View, *, width: int | None = None, full: bool = False) -> str:
    """The readable terminal view (``show`` without ``--json``); ``full`` = nothing shortened."""
    width = width or max(80, min(shutil.get_terminal_size((120, 40)).columns, 200))
    if isinstance(view, PairView):
        return _format_pair(view, width, full)
    return _format_state(view, width, full)


def _format_state(v: StateView, width: int, full: bool, agreeing: Sequence[str] = ()) -> str:
    lim, n_tool, n_text = (0, 0, 0) if full else (160, 6, 12)
    m = v.meta
    out = [f"━━ state {v.state_id} " + "━" * max(0, width - 10 - len(v.state_id))]
    out.append(f"stream   {m.get('stream_id')} ({m.get('stream_kind')})" + (f" agent {m['agent_id']}" if m.get("agent_id") else ""))
    out.append(f"source   {v.source_file}  {_lines_span(v.source_lines)}")
    bits = [b for b in (m.get("model"), m.get("version") and f"v{m['version']}", m.get("timestamp")) if b]
    if bits:
        out.append(f"agent    {' · '.join(bits)}")
    tool_names = [t.get("function", {}).get("name") for t in v.tools]
    render = ", ".join(f"{k}={val}" for k, val in v.render.items())
    out.append(f"prefix   {len(v.prefix)} messages · {render} · tools offered: {', '.join(tool_names) or 'none'}")
    for miss in v.missing:
        out.append(f"missing  {miss}")
    out.append("")
    out.append("── what the agent saw (the messages teachers are sent) " + "─" * max(0, width - 55))
    names = _tool_names(v.prefix)
    for i, msg in enumerate(v.prefix, 1):
        role = msg.get("role")
        text = flatten_content(msg.get("content"))
        if role == "tool":
            tid = msg.get("tool_call_id")
            head = f"[{i}] tool ← {names.get(tid, '?')} {tid}"
            if text == INTERRUPTED:
                out.append(f"{head}  INTERRUPTED (no result before this step)")
                continue
            out.append(head)
            out.append(_indent(_shorten(text, n_tool)))
        elif role == "assistant":
            out.append(f"[{i}] assistant")
            lines = _shorten(text, n_text).splitlines() if text else []
            for c in msg.get("tool_calls") or []:
                fn = c.get("function") or {}
                lines.append(f"→ {call_text(fn.get('name', '?'), fn.get('arguments'), lim)}   [{c.get('id')}]")
            out.append(_indent(lines or ["(empty)"]))
        else:
            out.append(f"[{i}] {role}")
            out.append(_indent(_shorten(text, 3 if role == "system" and not full else n_text)))
    out.append("")
    out.append("── what the agent did " + "─" * max(0, width - 22))
    out.append(_indent(_action_lines(v.action, lim, n_text)))
    if v.error_after:
        out.append("── the error that followed " + "─" * max(0, width - 27))
        for e in v.error_after:
            out.append(f"    {e.get('tool_name')} {e.get('tool_use_id')}:")
            out.append(_indent(_shorten(str(e.get("content") or ""), n_tool), 6))
    out.append("── teachers " + "─" * max(0, width - 12))
    if not v.teachers:
        out.append("    not replayed yet" if not v.replayed else "    (no rows)")
    else:
        out.append(f"    {_teacher_summary(v.teachers)}")
        for t in v.teachers:
            tok = f"{t.prompt_tokens if t.prompt_tokens is not None else '?'}+{t.completion_tokens if t.completion_tokens is not None else '?'} tok"
            if t.cached_tokens:
                tok += f" ({t.cached_tokens} cached)"
            out.append(f"  {t.teacher} ({t.model})  {t.status}  cost {_money(t.cost_usd)} paid {_money(t.paid_usd)}  {_secs(t.latency_s)}  {tok}  "
                       f"attempts {t.attempts}{_teacher_flags(t, agreeing)}")
            if t.elided_messages:
                out.append(f"      fitted: {t.elided_messages} messages elided before this point (the teacher's context window)")
            if t.reason:
                out.append(f"      reason: {t.reason}")
            if t.action:
                out.append(_indent(_action_lines(t.action, lim, n_text), 6))
            elif t.raw_answer:
                out.append(_indent(["raw answer (not parsed as an action):", *_shorten(t.raw_answer, n_text).splitlines()], 6))
    return "\n".join(out)


def _column(action: dict, width: int, full: bool) -> list[str]:
    lines = []
    for ln in _action_lines(action, 0 if full else 400, 0 if full else 20):
        lines += textwrap.wrap(ln, width, replace_whitespace=False, drop_whitespace=False) or [""]
    return lines


def _format_pair(p: PairView, width: int, full: bool) -> str:
    a = p.agreement
    agreeing = a.get("agreeing_teachers") or []
    head = [f"━━ pair {p.pair_id} ({p.pair_kind}) " + "━" * max(0, width - 12 - len(p.pair_id) - len(p.pair_kind or ""))]
    head.append("tables   " + "; ".join(
        f"{t['table']}: {t['status']}" + (f" by {t.get('drop_op')} ({t.get('drop_reason')})" if t.get("drop_op") else "")
        for t in p.tables))
    score = a.get("agreement_score")
    head.append(f"agree    {a.get('agreement_kind') or 'kind not recorded'}: {agreement_label(a)} ({', '.join(agreeing)})"
                + (f" · score {score:.2f}" if score is not None else "") + f" · pair cost {_money(a.get('cost_usd'))}")
    if p.prompt_matches_prefix is not None:
        head.append("prompt   " + ("the pair's stored prompt equals the prefix shown below" if p.prompt_matches_prefix
                                   else "DIFFERS from the prefix shown below (pairs built with other render options?)"))
    col = (width - 3) // 2
    left = _column(p.chosen, col, full)
    right = _column(p.rejected, col, full)
    side = [f"── chosen ({', '.join(agreeing) or 'teachers'})".ljust(col) + " │ " + "── rejected (the agent)"]
    side.append("─" * col + "─┼─" + "─" * col)
    for lft, rgt in zip_longest(left, right, fillvalue=""):
        side.append(lft.ljust(col) + " │ " + rgt)
    return "\n".join(head + side + ["", _format_state(p.state, width, full, agreeing)])


# --- markdown ----------------------------------------------------------------------------------
def _fence(text: str, lang: str = "") -> str:
    longest, run = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    f = "`" * max(3, longest + 1)
    return f"{f}{lang}\n{text}\n{f}"


def _md_cell(s: Any) -> str:
    return str(s if s is not None else "-").replace("|", "\\|").replace("\n", " ")


def _md_action(action: dict | None, full: bool) -> str:
    return _fence("\n".join(_action_lines(action, 0 if full else 400, 0 if full else 30)))


def render_markdown(view: View, *, full: bool = False, max_messages: int | None = None) -> str:
    """The same view as :func:`format_view`, in Markdown (e.g. Dagster asset metadata).

    ``max_messages`` keeps only the last N prefix messages (with a note), for size-limited metadata.
    """
    out: list[str] = []
    sv = view.state if isinstance(view, PairView) else view
    if isinstance(view, PairView):
        a = view.agreement
        agreeing = a.get("agreeing_teachers") or []
        out.append(f"## Pair `{view.pair_id}` ({view.pair_kind})")
        out.append("")
        tables_txt = ", ".join(f"{t['table']} ({t['status']})" for t in view.tables)
        out.append(f"- tables: {tables_txt}")
        out.append(f"- **agreement: {a.get('agreement_kind') or 'kind not recorded'}**, {agreement_label(a)}; teachers: {', '.join(agreeing)}"
                   + (f", score {a['agreement_score']:.2f}" if a.get("agreement_score") is not None else ""))
        out.append(f"- state: `{sv.state_id}`")
        if view.prompt_matches_prefix is not None:
            out.append(f"- stored prompt equals the rendered prefix: {'yes' if view.prompt_matches_prefix else '**no**'}")
        out.append("")
        out.append("| chosen (teacher consensus) | rejected (the agent's action) |")
        out.append("|---|---|")
        c = "<br>".join(_md_cell(x) for x in _action_lines(view.chosen, 400, 30))
        r = "<br>".join(_md_cell(x) for x in _action_lines(view.rejected, 400, 30))
        out.append(f"| {c} | {r} |")
        out.append("")
    else:
        agreeing = []
    m = sv.meta
    out.append(f"### State `{sv.state_id}`")
    out.append("")
    out.append(f"- stream: `{m.get('stream_id')}` ({m.get('stream_kind')})")
    out.append(f"- source: `{sv.source_file}` {_lines_span(sv.source_lines)}")
    out.append(f"- agent: {' · '.join(str(b) for b in (m.get('model'), m.get('version'), m.get('timestamp')) if b)}")
    out.append(f"- prefix: {len(sv.prefix)} messages ({', '.join(f'{k}={v}' for k, v in sv.render.items())})")
    for miss in sv.missing:
        out.append(f"- missing: {miss}")
    out.append("")
    out.append("#### What the agent saw (the messages teachers are sent)")
    out.append("")
    names = _tool_names(sv.prefix)
    msgs = list(enumerate(sv.prefix, 1))
    if max_messages is not None and len(msgs) > max_messages:
        out.append(f"*… {len(msgs) - max_messages} earlier messages not shown*")
        out.append("")
        msgs = msgs[-max_messages:]
    n_tool, n_text, lim = (0, 0, 0) if full else (6, 12, 160)
    for i, msg in msgs:
        role = msg.get("role")
        text = flatten_content(msg.get("content"))
        if role == "tool":
            tid = msg.get("tool_call_id")
            if text == INTERRUPTED:
                out.append(f"**{i}. tool ← {names.get(tid, '?')}** `{tid}` — *interrupted (no result before this step)*")
                out.append("")
                continue
            out.append(f"**{i}. tool ← {names.get(tid, '?')}** `{tid}`")
            out.append("")
            out.append(_fence(_shorten(text, n_tool)))
        elif role == "assistant":
            out.append(f"**{i}. assistant**")
            out.append("")
            lines = _shorten(text, n_text).splitlines() if text else []
            for c in msg.get("tool_calls") or []:
                fn = c.get("function") or {}
                lines.append(f"→ {call_text(fn.get('name', '?'), fn.get('arguments'), lim)}   [{c.get('id')}]")
            out.append(_fence("\n".join(lines) or "(empty)"))
        else:
            out.append(f"**{i}. {role}**")
            out.append("")
            out.append(_fence(_shorten(text, 3 if role == "system" and not full else n_text)))
        out.append("")
    out.append("#### What the agent did")
    out.append("")
    out.append(_md_action(sv.action, full))
    if sv.error_after:
        out.append("")
        out.append("#### The error that followed")
        out.append("")
        for e in sv.error_after:
            out.append(f"- `{e.get('tool_name')}` `{e.get('tool_use_id')}`:")
            out.append("")
            out.append(_fence(_shorten(str(e.get("content") or ""), n_tool)))
    out.append("")
    out.append("#### Teachers")
    out.append("")
    if not sv.teachers:
        out.append("*not replayed yet*")
    else:
        out.append(_teacher_summary(sv.teachers))
        out.append("")
        out.append("| teacher | model | status | cost | latency | tokens | notes | answer |")
        out.append("|---|---|---|---|---|---|---|---|")
        for t in sv.teachers:
            ans = "<br>".join(_md_cell(x) for x in _action_lines(t.action, 200, 8)) if t.action else _md_cell(t.reason or t.raw_answer)
            out.append(f"| {_md_cell(t.teacher)} | {_md_cell(t.model)} | {_md_cell(t.status)} | {_money(t.cost_usd)} | "
                       f"{_secs(t.latency_s)} | {t.prompt_tokens}+{t.completion_tokens}"
                       f"{f' ({t.cached_tokens} cached)' if t.cached_tokens else ''} | "
                       f"{_md_cell(_teacher_flags(t, agreeing).strip(' []'))}"
                       f"{f' {t.elided_messages} messages elided before this point' if t.elided_messages else ''} | {ans} |")
    return "\n".join(out) + "\n"


__all__ = [
    "MIN_PREFIX", "PairView", "ShowError", "StateView", "TeacherAnswer", "View", "call_text", "format_view", "gather",
    "pair_views", "render_markdown", "resolve_ids", "state_views", "to_json_line", "view_from_dict",
]
