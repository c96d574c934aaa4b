"""Pairs out as a Hugging Face dataset in the formats trainers read (TRL preference rows, SFT rows).

In:  a store holding ``normalized_dpo_pairs`` (and, for SFT, ``agreement_positives``).
Out: a dataset folder: ``data/train-00000-of-00001.parquet`` and ``data/test-00000-of-00001.parquet``
plus a dataset card ``README.md`` (fields, counts, agreement kinds, source agents, lineage columns,
the split rule; its YAML header names the splits, so ``datasets.load_dataset(folder)`` reads it too).

* ``trl``: TRL's conversational preference format. ``prompt`` is the rendered prefix as OpenAI chat
  messages (``role``, ``content``, ``tool_calls`` with JSON-string ``arguments``, ``tool_call_id``),
  ``chosen`` / ``rejected`` one assistant message each (the consensus / the agent's action); the
  pair's lineage columns sit beside them. Pairs only (``kind`` = ``pair``): a positive has no
  rejected side.
* ``sft``: TRL's conversational language-modeling format, ``messages`` = prompt + the chosen
  message, for every pair and every agreement positive (``kind`` says which).
* The split is the trainer's: a row is in ``test`` when ``train.data.is_heldout(state_id, fraction)``,
  the very function the trainer splits with, at the train recipe's ``heldout_fraction``; so nobody
  trains on the rows the pipeline evaluates on by accident.

Deliberately simplified: tool schemas stay a JSON string (``tools_json``): their argument objects
vary per tool, which a Parquet column of one type cannot hold; the folder is written locally.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from composer_pipeline.actions import Action
from composer_pipeline.render import flatten_content
from composer_pipeline.store import Store
from composer_pipeline.train.data import is_heldout

Format = Literal["trl", "sft"]
FORMATS = ("trl", "sft")
SPLITS = ("train", "test")

_TOOL_CALL = pa.struct(
    [
        ("id", pa.string()),
        ("type", pa.string()),
        ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
    ]
)
MESSAGE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("tool_calls", pa.list_(_TOOL_CALL)),
        ("tool_call_id", pa.string()),
    ]
)
MESSAGES = pa.list_(MESSAGE)

# the pair's lineage, kept beside the conversation (see tables.py for each)
LINEAGE = [
    ("pair_id", pa.string()),
    ("state_id", pa.string()),
    ("session_key", pa.string()),
    ("partition_key", pa.string()),
    ("session_id", pa.string()),
    ("source", pa.string()),
    ("source_file", pa.string()),
    ("source_lines", pa.list_(pa.int64())),
    ("record_uuids", pa.list_(pa.string())),
    ("replay_call_ids", pa.list_(pa.string())),
    ("agreement_kind", pa.string()),
    ("n_models_agreeing", pa.int64()),
    ("n_agreeing", pa.int64()),
    ("agreement_score", pa.float64()),
    ("tools_json", pa.string()),
]
SCHEMAS = {
    "trl": pa.schema([("prompt", MESSAGES), ("chosen", MESSAGES), ("rejected", MESSAGES), *LINEAGE]),
    "sft": pa.schema([("messages", MESSAGES), ("kind", pa.string()), *LINEAGE]),
}


@dataclass
class Exported:
    out: Path
    format: str
    rows: dict[str, int] = field(default_factory=dict)  # split -> rows
    agreement_kinds: Counter = field(default_factory=Counter)
    sources: Counter = field(default_factory=Counter)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (pair_id, reason)
    files: dict[str, str] = field(default_factory=dict)  # split -> parquet path

    def summary(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "format": self.format,
            "rows": self.rows,
            "agreement_kinds": dict(self.agreement_kinds),
            "sources": dict(self.sources),
            "skipped": len(self.skipped),
            "files": self.files,
        }


def chat_message(m: dict) -> dict:
    """One OpenAI chat message with exactly the :data:`MESSAGE` fields."""
    content = m.get("content")
    calls = m.get("tool_calls") or None
    return {
        "role": str(m.get("role") or ""),
        "content": content if content is None or isinstance(content, str) else flatten_content(content),
        "tool_calls": [
            {
                "id": str(c.get("id") or ""),
                "type": "function",
                "function": {
                    "name": str(c["function"].get("name") or ""),
                    "arguments": a if isinstance(a := c["function"].get("arguments"), str) else json.dumps(a),
                },
            }
            for c in calls
        ]
        if calls
        else None,
        "tool_call_id": m.get("tool_call_id"),
    }


def action_message(action_json: str) -> dict:
    return chat_message(Action.from_json(action_json).to_chat_message())


def _lineage(r: dict) -> dict:
    row = {name: r.get(name) for name, _ in LINEAGE if name != "tools_json"}
    # (pair tables from before the column: Claude Code's)
    row["source"] = r.get("source") or "claude"
    row["source_lines"] = r.get("source_lines") or []
    row["record_uuids"] = r.get("record_uuids") or []
    row["replay_call_ids"] = r.get("replay_call_ids") or []
    row["tools_json"] = r.get("tools") or "[]"
    return row


def _rows(store: Store, fmt: str, skipped: list) -> list[dict]:
    tables = ["normalized_dpo_pairs"] + (["agreement_positives"] if fmt == "sft" else [])
    if not store.exists("normalized_dpo_pairs"):
        raise FileNotFoundError(f"no normalized_dpo_pairs under {store.url('')}: run `composer-pipeline pairs` first")
    out = []
    for table in tables:
        if not store.exists(table):
            continue
        for r in store.read_table(table).to_pylist():
            if fmt == "trl" and r.get("kind") != "pair":
                continue
            try:
                prompt = [chat_message(m) for m in orjson.loads(r["prompt"])]
                chosen = action_message(r["chosen"])
                row = _lineage(r)
                if fmt == "trl":
                    row.update(prompt=prompt, chosen=[chosen], rejected=[action_message(r["rejected"])])
                else:
                    row.update(messages=[*prompt, chosen], kind=r.get("kind"))
            except (KeyError, TypeError, ValueError, AttributeError, orjson.JSONDecodeError) as e:
                skipped.append((str(r.get("pair_id")), f"{table}: {type(e).__name__}: {e}"))
                continue
            out.append(row)
    return out


def export_pairs(store_root: str, fmt: str, out: str | Path, heldout_fraction: float) -> Exported:
    """Write the dataset folder ``out`` (see the module docstring); returns what was written."""
    if fmt not in FORMATS:
        raise ValueError(f"export format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    res = Exported(Path(out), fmt)
    rows = _rows(Store(store_root), fmt, res.skipped)
    if not rows:
        raise ValueError(f"nothing to export from {store_root}: no {'pairs' if fmt == 'trl' else 'pairs or positives'}")
    split = {s: [r for r in rows if is_heldout(r["state_id"], heldout_fraction) == (s == "test")] for s in SPLITS}
    data = res.out / "data"
    data.mkdir(parents=True, exist_ok=True)
    for s, part in split.items():
        path = data / f"{s}-00000-of-00001.parquet"
        pq.write_table(pa.Table.from_pylist(part, schema=SCHEMAS[fmt]), path)
        res.rows[s], res.files[s] = len(part), str(path)
    res.agreement_kinds.update(r["agreement_kind"] for r in rows)
    res.sources.update(r["source"] for r in rows)
    (res.out / "README.md").write_text(dataset_card(res, heldout_fraction))
    return res


_FIELDS = {
    "trl": [
        (
            "prompt",
            "list of messages",
            "the state's prefix as the teachers saw it: system, user, assistant (with `tool_calls`), tool",
        ),
        ("chosen", "list of 1 message", "the teachers' consensus action, an assistant message"),
        ("rejected", "list of 1 message", "the agent's own action at that state"),
    ],
    "sft": [
        ("messages", "list of messages", "the prefix followed by the chosen assistant message"),
        ("kind", "string", "`pair` (the consensus differed from the agent) or `positive` (it agreed)"),
    ],
}
_LINEAGE_DOC = [
    ("pair_id", "the pair (`composer-pipeline lineage PAIR_ID` prints its chain)"),
    ("state_id", "the trace state; the split key"),
    ("session_key", "the session's file path under its trace root"),
    ("partition_key", "the Dagster partition of the session"),
    ("session_id", "the agent's session id"),
    ("source", "the agent that wrote the session: `claude` (Claude Code) or `codex` (Codex CLI)"),
    ("source_file", "the session file, relative to its trace root"),
    ("source_lines", "1-based lines of the agent's action in that file"),
    ("record_uuids", "the records that form the action"),
    ("replay_call_ids", "the teacher calls behind the consensus (content addresses in the response cache)"),
    ("agreement_kind", "`cross_model` (distinct models agreed) or `self_consistency` (samples of one model)"),
    ("n_models_agreeing", "distinct models whose answer is the consensus"),
    ("n_agreeing", "votes in the consensus"),
    ("agreement_score", "share of the votes that agreed"),
    ("tools_json", "the tools offered to the teachers, OpenAI function schemas as a JSON string"),
]


def dataset_card(res: Exported, heldout_fraction: float) -> str:
    """The dataset card: YAML header (splits) + fields, counts, agreement kinds, sources, lineage."""
    fields = _FIELDS[res.format]
    lines = [
        "---",
        "configs:",
        "- config_name: default",
        "  data_files:",
        *[f"  - split: {s}\n    path: data/{s}-*.parquet" for s in SPLITS],
        f"tags: [{'dpo' if res.format == 'trl' else 'sft'}, trl, coding-agents, composer-pipeline]",
        "---",
        "",
        f"# Coding-agent {'preference pairs' if res.format == 'trl' else 'SFT conversations'} (composer-pipeline)",
        "",
        "Written by `composer-pipeline export --format " + res.format + "`: agent states where teachers "
        "agreed on the next action, in TRL's conversational "
        + ("preference format (`DPOTrainer`)." if res.format == "trl" else "language-modeling format (`SFTTrainer`)."),
        "",
        "## Counts",
        "",
        "| split | rows |",
        "|---|---|",
        *[f"| {s} | {res.rows.get(s, 0)} |" for s in SPLITS],
        "",
        "| agreement kind | rows |",
        "|---|---|",
        *[f"| {k} | {n} |" for k, n in sorted(res.agreement_kinds.items())],
        "",
        "| source agent | rows |",
        "|---|---|",
        *[f"| {k} | {n} |" for k, n in sorted(res.sources.items())],
        "",
        "## Fields",
        "",
        "| field | type | what |",
        "|---|---|---|",
        *[f"| `{n}` | {t} | {w} |" for n, t, w in fields],
        "",
        "A message is `{role, content, tool_calls, tool_call_id}` (OpenAI chat shape; a tool call's "
        "`function.arguments` is a JSON string).",
        "",
        "## Lineage columns",
        "",
        "| field | what |",
        "|---|---|",
        *[f"| `{n}` | {w} |" for n, w in _LINEAGE_DOC],
        "",
        "## Split",
        "",
        f"`test` holds the rows whose state is held out by the trainer's rule: the first 8 bytes of "
        f"sha256(`state_id`) read as a fraction < {heldout_fraction} (`composer_pipeline.train.data.is_heldout`). "
        "Training on `train` only never sees a state the pipeline evaluates on.",
        "",
        "## Load",
        "",
        "```python",
        "from datasets import load_dataset",
        'ds = load_dataset("parquet", data_files={"train": "data/train-*.parquet", "test": "data/test-*.parquet"})',
        "```",
        "",
    ]
    if res.skipped:
        lines += ["## Skipped", "", f"{len(res.skipped)} rows could not be read (bad JSON in a stored column).", ""]
    return "\n".join(lines)
