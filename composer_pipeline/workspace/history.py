"""A session's tool calls in order, from the stored tables, and the workspace at each trace state.

In:  ``trace_messages`` and ``trace_states`` (one or many sessions, as ``ingest`` writes them). A Task call
     whose subagent's stream is stored (``parent_tool_use_id``) is not itself an unknown writer: its file
     effects are the subagent's calls.
Out: :func:`workspace_at` — the :class:`~.files.Workspace` one state's agent had seen (its own calls along
     its ``parentUuid`` path whose results came before the state, plus what the session's other agents did
     before it, by timestamp); :func:`observed_calls` — the state's own calls and what really came back.

Where the state's path crosses a ``compact_boundary`` (the conversation was compacted), a ``COMPACTION`` pseudo call
stands among the agent's own calls: Claude Code empties its read state there (:mod:`.files`).

Claude Code 1.0.x inline subagents (sidechain records inside the main file) share the session's one shell:
their workspace starts at the cwd of the session's first main record and follows every agent's ``cd``
(their own records' ``cwd`` is the shell's cwd when the subagent ended, as the records are written then).

Deliberately simplified: another agent's calls are placed by their result's timestamp (records of
different files have no other common order); a call with no result is "interrupted" (may or may not
have run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa

from composer_pipeline.actions import Action
from composer_pipeline.render import flatten_content, prefix_path
from composer_pipeline.workspace.files import COMPACTION, Event, Workspace, observed_ok


@dataclass
class Call:
    """One tool call and its result as recorded (``result`` None: no result came)."""

    id: str
    name: str
    arguments: dict[str, Any]
    line_no: int
    cwd: str | None
    # {"content", "is_error", "structured", "line_no", "timestamp"}
    result: dict[str, Any] | None = None

    def event(self, own: bool) -> Event:
        r = self.result
        if r is None:
            return Event(self.name, self.arguments, None, own=own, cwd=self.cwd)
        ok = observed_ok(r["is_error"], r["content"], r["structured"])
        return Event(self.name, self.arguments, ok, r["content"], r["structured"], own=own, cwd=self.cwd)


@dataclass
class _Stream:
    by_uuid: dict[str, dict] = field(default_factory=dict)
    calls_of: dict[str, list[Call]] = field(default_factory=dict)  # assistant uuid -> its calls
    calls: dict[str, Call] = field(default_factory=dict)  # tool_use id -> call


class SessionHistory:
    """Every stream's records and tool calls of the stored sessions."""

    def __init__(self, trace_messages: pa.Table, trace_states: list[dict] | None = None):
        # Task/Agent calls whose subagent's stream is stored: they touch files only through that subagent's
        # own tool calls, which every other agent's workspace observes (by timestamp)
        self.linked_tasks = {s["parent_tool_use_id"] for s in trace_states or () if s.get("parent_tool_use_id")}
        self.streams: dict[str, _Stream] = {}
        self.session_of: dict[str, str] = {}
        # 1.0.x subagents: sidechain records inside the main session file
        self.inline: set[str] = set()
        files_of: dict[str, set[tuple[str, bool]]] = {}
        cols = ["stream_id", "session_key", "uuid", "parent_uuid", "logical_parent_uuid", "record_type"]
        cols += ["subtype", "line_no", "timestamp", "raw", "source_file", "is_sidechain"]
        results: dict[str, list[tuple[str, dict]]] = {}
        for row in trace_messages.select(cols).to_pylist():
            sid = row["stream_id"]
            s = self.streams.setdefault(sid, _Stream())
            self.session_of[sid] = row["session_key"]
            files_of.setdefault(sid, set()).add((row.pop("source_file") or "", bool(row.pop("is_sidechain"))))
            u = row.get("uuid")
            if u and u not in s.by_uuid:
                s.by_uuid[u] = row
            obj = _loads(row.pop("raw"))
            msg = obj.get("message")
            content = msg.get("content") if isinstance(msg, dict) else None
            if row["record_type"] == "assistant" and isinstance(content, list):
                for b in content:
                    if isinstance(b, dict) and b.get("type") == "tool_use":
                        args = b.get("input")
                        if not isinstance(args, dict):
                            args = {}
                        call = Call(str(b.get("id")), str(b.get("name")), args, row["line_no"] or 0, obj.get("cwd"))
                        s.calls.setdefault(call.id, call)
                        s.calls_of.setdefault(u, []).append(call)
            elif row["record_type"] == "user" and isinstance(content, list):
                for b in content:
                    if isinstance(b, dict) and b.get("type") == "tool_result":
                        res = {
                            "content": flatten_content(b.get("content")),
                            "is_error": b.get("is_error"),
                            "structured": obj.get("toolUseResult"),
                            "line_no": row["line_no"] or 0,
                            "timestamp": row.get("timestamp") or "",
                        }
                        results.setdefault(sid, []).append((str(b.get("tool_use_id")), res))
        main_files = {f for fs in files_of.values() for f, side in fs if not side}
        self.inline = {sid for sid, fs in files_of.items() if all(side and f in main_files for f, side in fs)}
        for sid, items in results.items():
            calls = self.streams[sid].calls
            for tid, res in items:
                if tid in calls and calls[tid].result is None:
                    calls[tid].result = res

    def _own_calls(self, state: dict) -> list[Call]:
        s = self.streams.get(state["stream_id"])
        if s is None:
            return []
        first = min(state.get("source_lines") or [0]) or None
        path, _ = prefix_path(s, state.get("prefix_leaf_uuid"), "full")
        out: list[Call] = []
        seen: set[str] = set()
        for row in path:
            parent = s.by_uuid.get(row.get("parent_uuid") or "")
            if parent is not None and parent.get("subtype") == "compact_boundary":  # the path crossed it here
                out.append(Call(f"{COMPACTION}:{row.get('uuid')}", COMPACTION, {}, row.get("line_no") or 0, None))
                out[-1].result = {"content": "", "is_error": None, "structured": None, "line_no": 0, "timestamp": ""}
            # every row of the path is one of `by_uuid`'s, so it has a uuid
            for c in s.calls_of.get(row["uuid"], []):
                if c.id in seen:
                    continue
                seen.add(c.id)
                if c.result is not None and first is not None and c.result["line_no"] >= first:
                    c = Call(c.id, c.name, c.arguments, c.line_no, c.cwd)  # its result came after the state
                out.append(c)
        return out

    def _other_calls(self, state: dict) -> list[tuple[str, Call]]:
        """Calls of the session's other streams whose results came before the state (by timestamp)."""
        ts = state.get("timestamp") or ""
        session = self.session_of.get(state["stream_id"])
        out = []
        for sid, s in self.streams.items():
            if sid == state["stream_id"] or self.session_of.get(sid) != session:
                continue
            for c in s.calls.values():
                if c.result is not None and c.result["timestamp"] and c.result["timestamp"] < ts:
                    out.append((c.result["timestamp"], c))
        return out

    def workspace_at(self, state: dict) -> Workspace:
        """The workspace as the state's agent had seen it just before its action."""
        own = self._own_calls(state)
        session = self.session_of.get(state["stream_id"])
        shared = any(self.session_of[sid] == session for sid in self.inline)
        if shared:
            # 1.0.x: an inline subagent's records are written when it ends, each with the shell's cwd of that
            # moment (a record at 00:52:57 names a directory first made at 00:53:27); the shell is shared, so
            # its cwd is followed from the session's first record through every agent's cd
            cwd = self._session_start_cwd(session) or self._state_cwd(state)
        else:
            cwd = next((c.cwd for c in reversed(own) if c.cwd), None) or self._state_cwd(state)
        ws = Workspace(cwd)
        ws.shell_shared = shared
        # Claude Code 1.0.x subagents (inline sidechains): reads seen not to register (files.UNRELIABLE_READS)
        ws.reads_reliable = state.get("stream_kind") != "inline_sidechain"
        events: list[tuple[str, int, Event]] = []
        last_ts = ""
        for i, c in enumerate(own):
            if c.id in self.linked_tasks:
                continue
            if c.result is not None and c.result["timestamp"]:
                last_ts = c.result["timestamp"]
            events.append((last_ts, i, c.event(own=True)))
        others = sorted(
            ((t, c) for t, c in self._other_calls(state) if c.id not in self.linked_tasks), key=lambda x: x[0]
        )
        # own calls keep their path order; another agent's call goes before the first own call timed after it
        merged = _stable_merge(events, [(ts, -1, c.event(own=False)) for ts, c in others])
        for _, _, ev in merged:
            ws.observe(ev)
        return ws

    def _session_start_cwd(self, session: str | None) -> str | None:
        """The cwd of the session's first call in its main (live-written) stream."""
        for sid, s in self.streams.items():
            if self.session_of[sid] == session and sid not in self.inline:
                first = min((c for c in s.calls.values() if c.cwd), key=lambda c: c.line_no, default=None)
                if first is not None:
                    return first.cwd
        return None

    def _state_cwd(self, state: dict) -> str | None:
        s = self.streams.get(state["stream_id"])
        for c in s.calls.values() if s else ():
            if c.cwd:
                return c.cwd
        return None

    def observed_calls(self, state: dict) -> list[Call]:
        """The state's own tool calls, each with the result really recorded (None: interrupted)."""
        s = self.streams.get(state["stream_id"])
        action = Action.from_json(state["action"]) if state.get("action") else Action()
        out = []
        for tc in action.tool_calls:
            recorded = s.calls.get(tc.id) if s is not None else None
            if recorded is not None:
                out.append(recorded)
            else:
                out.append(Call(tc.id, tc.name, dict(tc.arguments), 0, None))
        return out


def _stable_merge(own: list[tuple[str, int, Event]], others: list[tuple[str, int, Event]]):
    out, j = [], 0
    for item in own:
        while j < len(others) and item[0] and others[j][0] < item[0]:
            out.append(others[j])
            j += 1
        out.append(item)
    out.extend(others[j:])
    return out


def _loads(raw: Any) -> dict:
    if not raw:
        return {}
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return obj if isinstance(obj, dict) else {}
