"""Codex CLI rollouts -> ``trace_messages`` / ``trace_states`` / ``quarantine`` rows (a Python-only reader).

In:  one rollout file's scrubbed bytes (``~/.codex/sessions/YYYY/MM/DD/rollout-<ts>-<uuid>.jsonl``), its
path relative to the trace root and its session key.
Out: :class:`CodexBuild`: the rows in the contracts of ``tables.py`` (``source`` = ``codex``), the
per-file report's counts. ``files.detect_format`` tells a Codex rollout from a Claude Code session.

Generations read (openai/codex ``RolloutItem`` / ``RolloutLine`` in codex-rs, the recorder in
``codex-rs/rollout``; a hand-written fixture of each in ``tests/ingest/codex_fixtures.py``):

* ``early``: cli 0.1-0.2: a bare ``SessionMeta`` first line (``id``, ``timestamp``, ``instructions``,
  ``git``), then bare ``ResponseItem`` lines and ``{"record_type": "state"}`` lines.
* ``shell``: ``{timestamp, type, payload}`` lines (``session_meta``, ``response_item``, ``event_msg``,
  later ``turn_context`` and ``compacted``); the ``shell`` tool with ``command: [argv]``, outputs as JSON
  strings ``{"output", "metadata": {"exit_code"}}``.
* ``exec``: cli >= 0.115: ``exec_command`` with ``cmd``, plain-text outputs (``Process exited with code N``),
  ``custom_tool_call`` (``apply_patch`` as free text), ``compacted.replacement_history``, ``ordinal``.

Every line becomes one ``trace_messages`` row (uuid ``L<line>``, its parent the row before it: a rollout is
one linear conversation) holding the scrubbed line in ``raw``; a line that is no JSON object, or no
rollout line, is a quarantine row instead. ``codex_items.blocks_of`` gives the renderer the content.

A state = one assistant step: the run of assistant-side items (reasoning, assistant message, function /
custom / local-shell calls, web searches) between two inputs (a user message, a call output, a
compaction); parallel calls of one response are one step, so every call in a later prefix is answered
by its output. A step with neither text nor a call (reasoning alone) is no state (counted). The prefix
leaf is the row before the step; ``error_after`` = the step's calls whose output failed
(``codex_items.failed``: a non-zero exit code or a failed call; in code mode, cli >= 0.15x, a failed
command's ``item_completed`` event before the output, the only place its exit code is). ``model`` from the latest
``turn_context``, ``version`` = ``cli_version``, ``usage`` = the next ``token_count`` event's
``last_token_usage``. ``event_msg`` lines repeat what response items carry and are kept for lineage only.

Deliberately simplified: a compaction starts the conversation again from what it kept (its
``replacement_history`` user and assistant messages, each with its role, else its summary) for either
``render.compaction`` option; the legacy
single-JSON rollout (``rollout-*.json`` of the TypeScript cli) is not read.
"""

from __future__ import annotations

import re
from array import array
from collections import Counter
from dataclasses import dataclass, field
from itertools import accumulate

import orjson
import pyarrow as pa

from composer_pipeline import codex_items, tables
from composer_pipeline.actions import Action
from composer_pipeline.ingest.states import ERROR_TEXT_CHARS, state_id_of
from composer_pipeline.jsonutil import dumps
from composer_pipeline.render import action_from_blocks, user_parts

SOURCE = "codex"
NOT_A_SESSION = "neither a Claude Code session nor a Codex rollout (no line of either format in the file's head)"
NOT_A_ROLLOUT_LINE = "not a Codex rollout line"

# a URL's userinfo with a password (``https://user:token@host``), matched right after a ``://``
_USERINFO = re.compile(rb"[^/\s\"'@:\\]{1,256}:[^/\s\"'@\\]{1,256}@")
URL_CREDENTIALS_KIND = "url_credentials"
_URL_TAG = f"[REDACTED:{URL_CREDENTIALS_KIND}]".encode()


def scrub_url_credentials(data: bytes, counts: Counter) -> bytes:
    """``scheme://user:password@`` -> ``scheme://[REDACTED:url_credentials]@`` (git remotes; counted)."""
    parts, start, pos = [], 0, data.find(b"://")
    while pos >= 0:
        m = _USERINFO.match(data, pos + 3)
        if m is not None:
            parts += [data[start : pos + 3], _URL_TAG]
            start = m.end() - 1  # (keeps the "@")
        pos = data.find(b"://", pos + 3)
    if not parts:
        return data
    counts[URL_CREDENTIALS_KIND] += len(parts) // 2
    return b"".join([*parts, data[start:]])


@dataclass
class _Row:
    line_no: int
    obj: dict
    raw: bytes
    record_type: str
    subtype: str | None = None
    role: str | None = None
    uuid: str = ""
    parent: str | None = None
    logical_parent: str | None = None
    message_key: str | None = None
    blocks: list[dict] | None = None


@dataclass
class CodexBuild:
    messages: dict[str, list] = field(default_factory=dict)
    states: dict[str, list] = field(default_factory=dict)
    quarantine: list[dict] = field(default_factory=list)
    lines: int = 0
    generation: str = "unknown"
    # steps with text or a call: what could be a state
    assistant_steps: int = 0
    reasoning_only_steps: int = 0  # steps with neither (not states)
    compactions: int = 0


def _classify(obj: dict) -> tuple[str, str | None, str | None] | None:
    """``(record_type, subtype, role)`` of a rollout line; ``None``: not a rollout line."""
    item = codex_items.item_of(obj)
    if item is not None:
        # (a damaged item's list or object type is no set member: unhashable)
        t = item.get("type") if isinstance(item.get("type"), str) else None
        if t == "message":
            role = item.get("role") if isinstance(item.get("role"), str) else None
            rt = role if role in ("user", "assistant") else "developer"
            return rt, "message", role
        if t in codex_items.ASSISTANT_ITEMS:
            return "assistant", t, "assistant"
        if t in codex_items.OUTPUT_ITEMS:
            return "user", t, "tool"
        return "response_item", t, None
    t = obj.get("type")
    if not isinstance(t, str | None):
        return None
    if t == "compacted":
        return "user", "compacted", "user"
    if t in codex_items.ROLLOUT_LINE_TYPES or (isinstance(t, str) and type(obj.get("payload")) is dict):
        # (a line type newer than this reader: kept for lineage, not rendered)
        p = obj.get("payload")
        sub = p.get("type") if type(p) is dict and isinstance(p.get("type"), str) else None
        return t, sub, None
    if obj.get("record_type") == "state":
        return "state", None, None
    if t is None and "id" in obj and "timestamp" in obj:
        return "session_meta", "early", None
    return None


def read_rollout(data: bytes, rel: str, session_key: str, quarantine_chars: int = 2000) -> CodexBuild:
    """One rollout file's rows (see the module docstring)."""
    out = CodexBuild()
    stream_id = f"{session_key}:main"
    rows: list[_Row] = []
    prev: str | None = None
    generations: Counter[str] = Counter()
    for line_no, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        out.lines = line_no
        reason = None
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            obj, reason = None, f"invalid JSON: {e}"
        if obj is not None and type(obj) is not dict:
            reason = "not a JSON object"
        kind = _classify(obj) if reason is None else None
        if kind is None:
            reason = reason or NOT_A_ROLLOUT_LINE
            out.quarantine.append(_quarantine_row(session_key, rel, line_no, reason, line, quarantine_chars))
            continue
        generations[_generation_of(obj)] += 1
        rt, sub, role = kind
        row = _Row(line_no, obj, line, rt, sub, role, uuid=f"L{line_no}")
        # the agent starts again from what the compaction kept
        if sub == "compacted":
            row.logical_parent, out.compactions = prev, out.compactions + 1
        else:
            row.parent = prev
        if rt in ("user", "assistant"):
            row.blocks = codex_items.blocks_of(obj) or []
        rows.append(row)
        prev = row.uuid
    out.generation = _overall_generation(generations)
    meta = _session_meta(rows)
    out.states = _states(rows, session_key, stream_id, rel, meta, out)
    out.messages = {
        "stream_id": [stream_id] * len(rows),
        "session_key": [session_key] * len(rows),
        "uuid": [r.uuid for r in rows],
        "parent_uuid": [r.parent for r in rows],
        "logical_parent_uuid": [r.logical_parent for r in rows],
        "record_type": [r.record_type for r in rows],
        "subtype": [r.subtype for r in rows],
        "message_key": [r.message_key for r in rows],
        "role": [r.role for r in rows],
        "is_meta": [False] * len(rows),
        "is_compact_summary": [r.subtype == "compacted" for r in rows],
        "is_sidechain": [False] * len(rows),
        "source_file": [rel] * len(rows),
        "line_no": [r.line_no for r in rows],
        "timestamp": [_str(r.obj.get("timestamp")) for r in rows],
        "raw": [r.raw for r in rows],
        "source": [SOURCE] * len(rows),
    }
    return out


def _str(v) -> str | None:
    return v if isinstance(v, str) else None


def _generation_of(obj: dict) -> str:
    if "payload" not in obj:
        return "early"
    item = codex_items.item_of(obj)
    if item is not None and item.get("type") in ("function_call", "custom_tool_call"):
        name = item.get("name")
        if name in ("exec_command", "shell_command") or item.get("type") == "custom_tool_call":
            return "exec"
        if name == "shell":
            return "shell"
    return "wrapped"


def _overall_generation(seen: Counter) -> str:
    for g in ("exec", "shell", "early"):
        if seen[g]:
            return g
    return "wrapped" if seen else "unknown"


def _quarantine_row(session_key: str, rel: str, line_no: int, reason: str, line: bytes, limit: int) -> dict:
    return {
        "session_key": session_key,
        "source_file": rel,
        "line_no": line_no,
        "reason": reason,
        "text": line.decode("utf-8", "replace")[:limit],
        "salvaged_uuid": None,
        "salvaged_parent_uuid": None,
        "source": SOURCE,
    }


def not_a_session_row(session_key: str, rel: str, data: bytes, limit: int, reason: str = NOT_A_SESSION) -> dict:
    """The one quarantine row of a file in neither format (line 0: the whole file)."""
    row = _quarantine_row(session_key, rel, 0, reason, data[:limit], limit)
    row["source"] = None
    return row


@dataclass
class _Meta:
    session_id: str | None = None
    version: str | None = None
    model: str | None = None


def _session_meta(rows: list[_Row]) -> _Meta:
    meta = _Meta()
    for r in rows:
        if r.record_type != "session_meta":
            continue
        p = r.obj.get("payload") if "payload" in r.obj else r.obj
        if type(p) is dict:
            meta.session_id = meta.session_id or _str(p.get("id"))
            meta.version = meta.version or _str(p.get("cli_version"))
            meta.model = meta.model or _str(p.get("model"))
    return meta


def _steps(rows: list[_Row]) -> list[list[_Row]]:
    """Assistant steps: runs of assistant-side rows, ended by the next user message, output or compaction."""
    steps: list[list[_Row]] = []
    current: list[_Row] | None = None
    for r in rows:
        if r.record_type == "assistant":
            if current is None:
                current = []
                steps.append(current)
            current.append(r)
            r.message_key = f"step-{current[0].line_no}"
        elif r.record_type == "user":
            current = None
    return steps


def _states(rows: list[_Row], session_key: str, stream_id: str, rel: str, meta: _Meta, out: CodexBuild) -> dict:
    steps = _steps(rows)
    outputs = {
        b["tool_use_id"]: (r, b)
        for r in rows
        if r.record_type == "user"
        for b in r.blocks or []
        if b.get("type") == "tool_result"
    }
    failures = _command_failures(rows)
    first_step_row = {s[0].line_no: s for s in steps}
    cols: dict[str, list] = {c: [] for c in tables.TRACE_STATES.names}
    n_messages = 1  # the system prompt
    known_calls: dict[str, str] = {}
    model = meta.model
    # indices of states still waiting for their token_count event
    pending_usage: list[int] = []
    emitted: set[str] = set()
    for r in rows:
        if r.record_type == "turn_context":
            p = r.obj.get("payload")
            model = _str(p.get("model")) if type(p) is dict and _str(p.get("model")) else model
        elif r.record_type == "event_msg" and r.subtype == "token_count" and pending_usage:
            usage = _last_token_usage(r.obj)
            for i in pending_usage:
                cols["usage"][i] = usage
            pending_usage = []
        elif r.record_type == "user":
            # the system prompt, then each kept message (as render.py makes them)
            if r.subtype == "compacted":
                kept = codex_items.kept_messages(r.blocks)
                n_messages = 1 + sum(1 for _, blocks in kept if user_parts(blocks, known_calls))
            elif user_parts(r.blocks, known_calls):
                n_messages += 1
        elif r.record_type == "assistant" and r.message_key not in emitted:
            if r.message_key is None:
                raise ValueError(f"{rel}:{r.line_no}: an assistant row without a step key (_steps gives every one)")
            emitted.add(r.message_key)
            step = first_step_row[r.line_no]
            blocks = [b for s in step for b in s.blocks or []]
            action = action_from_blocks(blocks)
            n_calls = len(action.tool_calls)
            for c in action.tool_calls:
                known_calls[c.id] = c.name
            if action.is_empty:
                out.reasoning_only_steps += 1
            else:
                out.assistant_steps += 1
                pending_usage.append(len(cols["state_id"]))
                _add_state(cols, step, action, outputs, failures, session_key, stream_id, rel, meta, model, n_messages)
            n_messages += 1 + n_calls
    return cols


def _command_failures(rows: list[_Row]) -> dict[str, str]:
    """Calls one of whose commands failed, as only an ``item_completed`` event says: code mode (cli >= 0.15x)
    runs a script of commands in one ``exec`` call whose output carries no exit code. An event between a
    call and its output belongs to that call when it is the only one waiting (else it is left unassigned)."""
    failures: dict[str, str] = {}
    waiting: list[str] = []
    for r in rows:
        if r.record_type in ("assistant", "user"):
            for b in r.blocks or []:
                if b.get("type") == "tool_use":
                    waiting.append(b["id"])
                elif b.get("type") == "tool_result" and b.get("tool_use_id") in waiting:
                    waiting.remove(b["tool_use_id"])
        elif r.record_type == "event_msg" and r.subtype == "item_completed" and len(waiting) == 1:
            text = _failed_command_text(r.obj.get("payload", {}).get("item"))
            if text is not None:
                failures[waiting[0]] = (failures[waiting[0]] + "\n" + text) if waiting[0] in failures else text
    return failures


def _failed_command_text(item) -> str | None:
    """``<command>: exit code N`` and its output, for a ``CommandExecution`` item that failed; else ``None``."""
    if type(item) is not dict or item.get("type") != "CommandExecution":
        return None
    code = item.get("exit_code")
    if not (type(code) is int and code != 0) and item.get("status") != "failed":
        return None
    command = item.get("command")
    command = command[-1] if isinstance(command, list) and command else command
    output = item.get("aggregated_output")
    head = f"{command if isinstance(command, str) else 'a command'}: exit code {code}"
    return f"{head}\n{output}" if isinstance(output, str) and output else head


def _add_state(
    cols, step, action: Action, outputs, failures, session_key, stream_id, rel, meta, model, n_prefix
) -> None:
    key = step[0].message_key
    errors = []
    for c in action.tool_calls:
        got = outputs.get(c.id)
        if got is not None and got[1].get("is_error"):
            text = str(got[1].get("content") or "")
        elif c.id in failures:
            text = failures[c.id]
        else:
            continue
        errors.append({"tool_use_id": c.id, "tool_name": c.name, "content": text[:ERROR_TEXT_CHARS]})
    row = {
        "state_id": state_id_of(session_key, stream_id, key),
        "session_id": meta.session_id,
        "session_key": session_key,
        "stream_id": stream_id,
        "stream_kind": "main",
        "agent_id": None,
        "parent_tool_use_id": None,
        "source_file": rel,
        "source_lines": [r.line_no for r in step],
        "record_uuids": [r.uuid for r in step],
        "message_id": key,
        "request_id": None,
        "prefix_leaf_uuid": step[0].parent,
        "n_prefix_messages": n_prefix,
        "action": action.to_json().encode(),
        "error_after": dumps(errors) if errors else None,
        "has_error": bool(errors),
        "model": model,
        "version": meta.version,
        "timestamp": _str(step[0].obj.get("timestamp")),
        "usage": None,
        "source": SOURCE,
    }
    for column, value in row.items():
        cols[column].append(value)


def _last_token_usage(obj: dict) -> bytes | None:
    p = obj.get("payload")
    info = p.get("info") if type(p) is dict else None
    usage = info.get("last_token_usage") if type(info) is dict else None
    return dumps(usage) if usage is not None else None


# ---- Arrow columns from buffers ------------------------------------------------------------------
# ``pa.array`` (and ``pa.scalar``) import pandas on first use where pyarrow has numpy: ~0.2 CPU-s of an
# ingest process that reads a rollout. The reader's columns are built from buffers instead (``array``
# offsets and int bitmaps: numpy is not loaded in the ingest CLI, cli/ingest.py).


def table_of(name: str, columns: dict[str, list]) -> pa.Table:
    """Column lists -> an Arrow table with exactly ``tables.SCHEMAS[name]`` (strings may be ``bytes``:
    every row value here comes from a line ``orjson`` parsed, so it is valid UTF-8)."""
    schema = tables.SCHEMAS[name]
    return pa.Table.from_arrays([_column(columns[f.name], f.type) for f in schema], schema=schema)


def _bitmap(flags: list[bool]) -> pa.Buffer:
    """Arrow's LSB-first bitmap of ``flags`` (bit i of byte i // 8 is flag i)."""
    bits = "".join("1" if f else "0" for f in reversed(flags))
    return pa.py_buffer(int(bits or "0", 2).to_bytes((len(flags) + 7) // 8, "little"))


def _validity(values: list) -> tuple[pa.Buffer | None, int]:
    nulls = values.count(None)
    if not nulls:
        return None, 0
    return _bitmap([v is not None for v in values]), nulls


def _offsets(lengths) -> pa.Buffer:
    return pa.py_buffer(array("i", accumulate(lengths, initial=0)))  # (int32)


def _column(values: list, typ: pa.DataType) -> pa.Array:
    n = len(values)
    validity, nulls = _validity(values)
    if pa.types.is_string(typ):
        encoded = [b"" if v is None else v.encode() if type(v) is str else v for v in values]
        return pa.Array.from_buffers(
            typ, n, [validity, _offsets(map(len, encoded)), pa.py_buffer(b"".join(encoded))], null_count=nulls
        )
    if pa.types.is_int64(typ):
        data = array("q", (0 if v is None else v for v in values))
        return pa.Array.from_buffers(typ, n, [validity, pa.py_buffer(data)], null_count=nulls)
    if pa.types.is_boolean(typ):
        bits = _bitmap([v is True for v in values])
        return pa.Array.from_buffers(typ, n, [validity, bits], null_count=nulls)
    if pa.types.is_list(typ):
        items = [[] if v is None else v for v in values]
        child = _column([x for v in items for x in v], typ.value_type)
        return pa.ListArray.from_buffers(
            typ, n, [validity, _offsets(map(len, items))], null_count=nulls, children=[child]
        )
    raise TypeError(f"no buffer builder for {typ}")
