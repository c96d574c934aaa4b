"""Presentation helpers for asset metadata: preview tables, rendered chats as Markdown, PNG data URIs.

In: pyarrow tables / OpenAI chat message lists. Out: ``dg.MetadataValue`` objects. Long texts are
truncated (the full rows stay in Parquet); nothing here changes data.
"""

import base64
import json
from collections import Counter
from typing import Any, Iterable

import dagster as dg
import pyarrow as pa


def _short(v: Any, n: int = 120) -> str:
    s = v if isinstance(v, str) else json.dumps(v, default=str)
    s = s.replace("\n", " ")
    return s if len(s) <= n else s[: n - 1] + "…"


def preview(table: pa.Table, columns: Iterable[str], n: int = 5, width: int = 80) -> dg.MetadataValue:
    """A small ``MetadataValue.table`` of the first ``n`` rows (strings truncated)."""
    cols = [c for c in columns if c in table.column_names]
    rows = table.select(cols).slice(0, n).to_pylist()
    schema = dg.TableSchema(columns=[dg.TableColumn(c, "string") for c in cols])
    records = [dg.TableRecord({c: _short(r[c], width) if r[c] is not None else "" for c in cols}) for r in rows]
    return dg.MetadataValue.table(records=records, schema=schema)


def counts(values: Iterable[Any]) -> dict[str, int]:
    return {str(k): int(v) for k, v in Counter(values).most_common()}


def json_md(d: dict) -> dg.MetadataValue:
    return dg.MetadataValue.json(d)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, dict):
            parts.append(block.get("text") or json.dumps(block)[:400])
        else:
            parts.append(str(block))
    return "\n".join(parts)


def chat_markdown(messages: list[dict], max_chars: int = 600, tail: int = 8) -> str:
    """The last ``tail`` messages of an OpenAI chat list as Markdown (what a teacher receives)."""
    lines = []
    if len(messages) > tail:
        lines.append(f"*… {len(messages) - tail} earlier messages not shown …*\n")
    for m in messages[-tail:]:
        text = _content_text(m.get("content"))
        if len(text) > max_chars:
            text = text[:max_chars] + " …"
        lines.append(f"**{m.get('role')}**" + (f" (`{m['tool_call_id']}`)" if m.get("tool_call_id") else ""))
        if text.strip():
            lines.append("```text\n" + text.replace("```", "ʼʼʼ") + "\n```")
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function", {})
            lines.append(f"→ tool call `{fn.get('name')}` `{_short(fn.get('arguments'), 300)}`")
        lines.append("")
    return "\n".join(lines)


def png_markdown(png_path: str, title: str) -> dg.MetadataValue:
    data = base64.b64encode(open(png_path, "rb").read()).decode()
    return dg.MetadataValue.md(f"### {title}\n\n![{title}](data:image/png;base64,{data})")
