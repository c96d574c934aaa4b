"""Row-level lineage: from a pair id back to the raw (scrubbed) JSONL lines it came from.

In:  one or more stores (:class:`~composer_pipeline.stores.Stores`, the multi-store read ``show`` uses
     too; local or ``s3://``) holding the pair tables, ``teacher_replays``, ``trace_states`` and
     ``trace_messages``; a pair id (full, or a unique prefix of at least 6 characters, resolved by
     :mod:`composer_pipeline.ids` with ``show``'s rules and words), or a session (its session key, or
     the short partition key the Dagster UI shows, ``calc/a1f0c3d2``: every pair of it).
Out: :func:`resolve_pairs` -> the pair ids asked for; :func:`trace_pair` -> a JSON-able dict, the chain
     ``pair -> replay calls -> state -> session -> source file + line numbers + record uuids -> raw lines``;
     :func:`format_lineage` -> the same chain as text for a terminal.

A link that cannot be followed (table not stored, id not found) is reported in ``missing``,
never silently skipped. Deliberately simplified: whole tables are read (pyarrow with a filter on
the id columns), which is fine up to a few million rows per table.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

import orjson

from composer_pipeline.ids import MIN_PREFIX, resolve_id, session_of
from composer_pipeline.pairs.build import agreement_label
from composer_pipeline.store import Store
from composer_pipeline.stores import Stores

# where a pair can live, and what that says
from composer_pipeline.tables import PAIR_AGREEMENT_FIELDS, PAIR_TABLES

StoresLike = Stores | Store | Sequence[Store]


def resolve_pair_id(store: StoresLike, pair_id: str) -> str:
    """The full pair id for ``pair_id`` (exact, or a unique prefix of >= 6 chars)."""
    stores = Stores.of(store)
    pid = pair_id.strip().lower()
    # the resolver's own wording, before any table is read
    if len(pid) < MIN_PREFIX:
        resolve_id(pair_id, {"pair": ()}, "")
    ids: set[str] = set()
    any_table = False
    for name, _ in PAIR_TABLES:
        t = stores.read(name, "pair_id", [pid], prefix=True)
        if t is not None:
            any_table = True
            ids.update(t.column("pair_id").to_pylist())
    if not any_table:
        raise FileNotFoundError(f"no pair tables under {stores.where} (run `composer-pipeline pairs` first)")
    return resolve_id(pair_id, {"pair": ids}, stores.where)[1]  # the same rules and words as show


def resolve_pairs(store: StoresLike, raw: str) -> tuple[str | None, list[str]]:
    """``(session, pair ids)`` that ``raw`` names: ``(None, [one pair])`` (:func:`resolve_pair_id`), or a
    session named by its session key or the short partition key the Dagster UI shows (``calc/a1f0c3d2``)
    and every pair of it, in table order."""
    stores = Stores.of(store)
    by_session: dict[str, list[str]] = {}
    sessions: set[str] = set()
    for name in [n for n, _ in PAIR_TABLES] + ["trace_states"]:
        t = stores.read(name, columns=["session_key"] if name == "trace_states" else ["session_key", "pair_id"])
        if t is None:
            continue
        keys = t.column("session_key").to_pylist()
        sessions.update(k for k in keys if k)
        if name != "trace_states":
            for key, pid in zip(keys, t.column("pair_id").to_pylist()):
                if pid not in by_session.setdefault(key, []):
                    by_session[key].append(pid)
    session = session_of(raw, sessions, stores.where)
    if session is None:
        return None, [resolve_pair_id(stores, raw)]
    if not by_session.get(session):
        raise ValueError(
            f"no pairs of session {session} under {stores.where} (its states: composer-pipeline show {raw.strip()})"
        )
    return session, by_session[session]


def trace_pair(store: StoresLike, pair_id: str) -> dict[str, Any]:
    """The whole chain behind one pair, down to the scrubbed raw JSONL lines."""
    stores = Stores.of(store)
    pid = resolve_pair_id(stores, pair_id)
    missing: list[str] = []
    appearances = []
    pair: dict | None = None
    for name, status in PAIR_TABLES:
        t = stores.read(name, "pair_id", [pid])
        if t is None or not t.num_rows:
            continue
        row = t.slice(0, 1).to_pylist()[0]
        app = {"table": name, "status": status}
        if name == "dropped_pairs":
            app.update(drop_op=row["drop_op"], drop_reason=row["drop_reason"], drop_stats=row["drop_stats"])
        appearances.append(app)
        if pair is None:
            pair = row
    assert pair is not None  # resolve_pair_id found it
    pair_out = {k: pair.get(k) for k in ("pair_id", "kind", "state_id", "session_key", *PAIR_AGREEMENT_FIELDS)}
    pair_out["tables"] = appearances

    call_ids = list(pair.get("replay_call_ids") or [])
    replays: list[dict] = []
    t = stores.read("teacher_replays", "call_id", call_ids) if call_ids else None
    if t is None:
        missing.append("teacher_replays: table not stored")
    else:
        got = {r["call_id"]: r for r in t.to_pylist()}
        for cid in call_ids:
            r = got.get(cid)
            if r is None:
                missing.append(f"teacher_replays: call {cid} not found")
                continue
            replays.append(
                {
                    k: r.get(k)
                    for k in (
                        "call_id",
                        "teacher",
                        "model",
                        "status",
                        "reason",
                        "cost_usd",
                        "paid_usd",
                        "cache_hit",
                        "created_at",
                        "action",
                        "prompt_tokens",
                        "cached_tokens",
                        "elided_messages",
                    )
                }
            )

    state: dict | None = None
    t = stores.read("trace_states", "state_id", [pair["state_id"]])
    if t is None:
        missing.append("trace_states: table not stored")
    elif not t.num_rows:
        missing.append(f"trace_states: state {pair['state_id']} not found")
    else:
        s = t.slice(0, 1).to_pylist()[0]
        state = {
            k: s.get(k)
            for k in (
                "state_id",
                "session_id",
                "session_key",
                "stream_id",
                "stream_kind",
                "agent_id",
                "message_id",
                "request_id",
                "prefix_leaf_uuid",
                "n_prefix_messages",
                "source_file",
                "source_lines",
                "record_uuids",
                "has_error",
                "model",
                "version",
                "timestamp",
                "source",
            )
        }
    src = state or pair
    session = {
        "session_key": src.get("session_key") or pair.get("session_key"),
        "session_id": src.get("session_id") or pair.get("session_id"),
        "source_file": src.get("source_file"),
    }
    lines = list(src.get("source_lines") or [])
    uuids = list(src.get("record_uuids") or [])
    records: list[dict] = []
    t = stores.read("trace_messages", "source_file", [src.get("source_file") or ""])
    if t is None:
        missing.append("trace_messages: table not stored")
    else:
        key = session["session_key"]
        wanted = set(lines)
        rows = [r for r in t.to_pylist() if r["line_no"] in wanted and (not key or r["session_key"] == key)]
        rows.sort(key=lambda r: r["line_no"])
        seen_lines = set()
        for r in rows:
            if r["line_no"] in seen_lines:
                continue
            seen_lines.add(r["line_no"])
            records.append(
                {
                    "source_file": r["source_file"],
                    "line_no": r["line_no"],
                    "uuid": r["uuid"],
                    "record_type": r["record_type"],
                    "uuid_matches": r["uuid"] in uuids if uuids else None,
                    "raw": r["raw"],
                }
            )
        for ln in lines:
            if ln not in seen_lines:
                missing.append(f"trace_messages: {src.get('source_file')} line {ln} not found")
    return {
        "pair": pair_out,
        "replays": replays,
        "state": state,
        "session": session,
        "records": records,
        "missing": missing,
    }


def _clip(text: str, lines: int = 12, chars: int = 1500) -> str:
    """The first lines of a consensus/agent text, saying how much is left out."""
    kept = text[:chars].splitlines()[:lines] or [""]
    rest = len(text) - len("\n".join(kept))
    return "\n".join(kept) + (f"\n… ({rest} more characters: --json has all)" if rest > 0 else "")


def format_lineage(chain: dict[str, Any]) -> str:
    """A readable, indented rendering of :func:`trace_pair`'s chain."""
    p = chain["pair"]
    out = [f"pair {p['pair_id']}  ({p['kind']}; {', '.join(a['table'] + ':' + a['status'] for a in p['tables'])})"]
    for a in p["tables"]:
        if a["table"] == "dropped_pairs":
            out.append(f"  dropped by {a['drop_op']}: {a['drop_reason']}")

    out.append(
        f"  agreement {p.get('agreement_kind') or 'kind not recorded'}: {agreement_label(p)} "
        f"(score {p['agreement_score']:.2f}) teachers={','.join(p['agreeing_teachers'] or [])}  cost=${(p['cost_usd'] or 0):.6f}"
    )
    out.append(f"  consensus: {p['consensus_signature']}")
    out.append(textwrap.indent(_clip(p.get("chosen_text") or ""), "    │ "))
    out.append(f"  agent:     {p['agent_signature']}")
    out.append(textwrap.indent(_clip(p.get("rejected_text") or ""), "    │ "))
    out.append(f"  replay calls ({len(chain['replays'])}):")
    for r in chain["replays"]:
        cost = r["cost_usd"] if r["cost_usd"] is not None else 0.0
        paid = r.get("paid_usd")
        paid = (0.0 if r["cache_hit"] else cost) if paid is None else paid  # tables written before paid_usd
        out.append(
            f"    {r['call_id'][:16]}  {r['teacher']:<12} {r['model'] or '':<20} {r['status']:<10} "
            f"cost ${cost:.6f}  paid ${paid:.6f}{' (cache)' if r['cache_hit'] else ''}"
            + (
                f"  {r['cached_tokens']} of {r.get('prompt_tokens')} prompt tokens billed cached"
                if r.get("cached_tokens")
                else ""
            )
            + (f"  {r['elided_messages']} messages elided before this point" if r.get("elided_messages") else "")
        )
    s = chain["state"]
    if s:
        out.append(f"  state {s['state_id']}  stream={s['stream_id']}  message={s['message_id']}")
    sess = chain["session"]
    out.append(f"  session {sess['session_key']}  id={sess['session_id']}")
    out.append(f"  source  {sess['source_file']}")
    for r in chain["records"]:
        out.append(f"    line {r['line_no']}  {r['record_type']}  uuid={r['uuid']}")
        out.append(textwrap.indent(r["raw"] if len(r["raw"]) <= 2000 else r["raw"][:2000] + " …[truncated]", "      "))
    for m in chain["missing"]:
        out.append(f"  MISSING {m}")
    return "\n".join(out)


def to_json(chain: dict[str, Any] | list[dict[str, Any]]) -> str:
    return orjson.dumps(chain, option=orjson.OPT_INDENT_2).decode()
