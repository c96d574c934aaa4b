"""Presentation helpers for asset metadata: preview tables, counts, PNG data URIs.

In: pyarrow tables. Out: ``dg.MetadataValue`` objects. Long texts are truncated (the full rows stay in
Parquet); nothing here changes data. State and pair examples are ``composer_pipeline.show.render_markdown``
(the one Markdown renderer of each view, the same view `composer-pipeline show` prints).
"""

import base64
import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

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


def png_markdown(png_path: str, title: str) -> dg.MetadataValue:
    data = base64.b64encode(open(png_path, "rb").read()).decode()
    return dg.MetadataValue.md(f"### {title}\n\n![{title}](data:image/png;base64,{data})")
