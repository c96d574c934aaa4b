"""Tool results read out of a damaged JSONL line (cut mid-write or garbled, so not JSON any more).

In:  the text of a line that did not parse (a quarantined line, kept as the ``raw`` of its ``damaged``
     pass-through row in ``trace_messages``).
Out: :func:`salvaged_tool_results`: ``[(tool_use_id, text)]`` for each ``tool_result`` block whose
     ``tool_use_id`` is complete and whose ``content`` has begun: a string content decoded up to
     where it was cut or garbled, a block list as the text of its ``text`` blocks (joined by newlines).

Ingest (both engines) marks a damaged row that holds such results with subtype :data:`SALVAGED_RESULTS`;
the renderer then answers those calls with the salvaged text behind :data:`SALVAGED_MARK` instead of
``[interrupted: no result]`` (which stays for results that are truly absent).

Deliberately simplified: ``is_error`` and ``toolUseResult`` of a damaged line are not read (an error
result salvaged this way does not count in ``error_after``); a ``content`` written before the
``tool_use_id`` of its block is not found; images in a block list are dropped.
"""

from __future__ import annotations

import json
import re

# json's C scanner: json.decoder.scanstring is this function, which typeshed declares only here
from _json import scanstring

# the subtype of a damaged row holding salvageable results
SALVAGED_RESULTS = "tool_result_salvaged"
SALVAGED_MARK = "[salvaged from a damaged line]"

_ID_RE = re.compile(r'"tool_use_id"\s*:\s*"((?:[^"\\]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*)"')
_CONTENT_RE = re.compile(r'"content"\s*:\s*([\["])')
_TEXT_RE = re.compile(r'"text"\s*:\s*"')


def _string_at(closed: str, start: int) -> str:
    """The JSON string whose body starts at ``closed[start]`` (``closed``: the line with a quote appended,
    which ends a string the cut left open), decoded as far as it is intact: up to its closing quote,
    else up to the cut (a dangling escape dropped) or to its first invalid escape. (json's C scanner: a
    pattern over the body backtracks, and faults in a stack, on long outputs.)"""
    s = closed
    for _ in range(4):
        try:
            # (strict=False: raw control characters, as in a cut line)
            out = scanstring(s, start, False)[0]
            break
        except json.JSONDecodeError as e:
            # the appended quote went to a dangling backslash
            if e.msg.startswith("Unterminated"):
                s = s[:-2] + '"'
            # an invalid escape: the text ends before it
            else:
                s = s[: e.pos if s[e.pos] == "\\" else e.pos - 1] + '"'
    else:
        return ""
    return out.encode("utf-8", "replace").decode() if not out.isascii() else out  # a lone surrogate -> '?'


def salvaged_tool_results(text: str) -> list[tuple[str, str]]:
    """``[(tool_use_id, result text)]`` readable in a damaged line (see the module docstring)."""
    if '"tool_use_id"' not in text:
        return []
    ids = list(_ID_RE.finditer(text))
    closed = text + '"'
    out: list[tuple[str, str]] = []
    for i, m in enumerate(ids):
        end = ids[i + 1].start() if i + 1 < len(ids) else len(text)
        c = _CONTENT_RE.search(text, m.end(), end)
        if c is None:
            continue
        tid = json.loads(f'"{m.group(1)}"')
        if c.group(1) == '"':
            out.append((tid, _string_at(closed, c.end())))
        else:
            parts = [_string_at(closed, t.end()) for t in _TEXT_RE.finditer(text, c.end(), end)]
            out.append((tid, "\n".join(parts)))
    return out
