"""Synthetic pair tables (per composer_pipeline/tables.py) for trainer tests and the benchmark.

In:  a Store root and a row count. Out: ``pairs.parquet`` (kind ``pair``) and ``positives.parquet``
(kind ``positive``) with rendered prompts, tools, actions, and an error after every other state.
Deliberately simplified: one tiny agent scenario (Edit before Read) repeated over file names.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
import pyarrow as pa

from composer_pipeline import tables
from composer_pipeline.actions import Action, ToolCall
from composer_pipeline.store import Store

TOOLS = [
    {
        "type": "function",
        "function": {"name": n, "parameters": {"type": "object", "properties": {k: {"type": "string"}}}},
    }
    for n, k in (("Read", "file_path"), ("Bash", "command"), ("Edit", "file_path"))
]


def _sid(i: int) -> str:
    return hashlib.sha256(f"state{i}".encode()).hexdigest()[:20]


def pair_rows(n: int = 12, *, both_directions: bool = False) -> list[dict]:
    """``n`` states (every third a positive). By default every pair prefers Read over the agent's Edit of
    an unread file; ``both_directions``: at every other state the file was already read and the pair
    prefers Edit over the agent's second Read, so "always Read" cannot fit the pairs."""
    rows = []
    for i in range(n):
        path = f"/repo/src/mod{i}.py"
        edit = Action(
            text="Editing.",
            tool_calls=(ToolCall("Edit", {"file_path": path, "old_string": "a", "new_string": "b"}, "t1"),),
        )
        read = Action(text="", tool_calls=(ToolCall("Read", {"file_path": path}, "t1"),))
        was_read = both_directions and i % 2 == 1
        agent, chosen = (read, edit) if was_read else (edit, read)
        kind = "pair" if i % 3 != 2 else "positive"
        if kind == "positive":
            chosen = agent
        has_error = i % 2 == 0 and not was_read
        error = (
            orjson.dumps(
                [{"tool_use_id": "t1", "tool_name": "Edit", "content": "File has not been read yet. Read it first."}]
            ).decode()
            if has_error
            else None
        )
        prompt = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": f"Fix the bug in mod{i}.py"},
            {
                "role": "assistant",
                "content": "Looking.",
                "tool_calls": [
                    {"id": "t0", "type": "function", "function": {"name": "Bash", "arguments": '{"command":"ls"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "t0", "content": f"mod{i}.py tests"},
        ]
        if was_read:
            call = {
                "id": "r0",
                "type": "function",
                "function": {"name": "Read", "arguments": orjson.dumps({"file_path": path}).decode()},
            }
            prompt += [
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "r0", "content": f"1\tdef f():\n2\t    return a  # mod{i}"},
            ]
        sid = _sid(i)
        rows.append(
            {
                "pair_id": hashlib.sha256(f"{sid}|sig".encode()).hexdigest()[:20],
                "kind": kind,
                "state_id": sid,
                "session_key": "synth__s1",
                "partition_key": "synth/s1",
                "session_id": "s1",
                "source_file": "synth/s1.jsonl",
                "source_lines": [i + 1],
                "record_uuids": [f"u{i}"],
                "replay_call_ids": [f"c{i}"],
                "prompt": orjson.dumps(prompt).decode(),
                "tools": orjson.dumps(TOOLS).decode(),
                "chosen": chosen.to_json(),
                "rejected": agent.to_json(),
                "chosen_text": chosen.to_text(),
                "rejected_text": agent.to_text(),
                "agreement_kind": "cross_model",
                "n_teachers": 3,
                "n_models": 3,
                "n_models_agreeing": 2,
                "n_agreeing": 2,
                "agreeing_teachers": ["a", "b"],
                "agreement_score": 0.67,
                "consensus_signature": "sig",
                "agent_signature": "asig",
                "cost_usd": 0.0,
                "has_error": has_error,
                "error_after": error,
            }
        )
    return rows


def write_store(root: str | Path, n: int = 12, *, both_directions: bool = False) -> str:
    """Write pairs.parquet + positives.parquet (flat CLI layout) under ``root``."""
    store = Store(str(root))
    rows = pair_rows(n, both_directions=both_directions)
    pairs = [r for r in rows if r["kind"] == "pair"]
    positives = [r for r in rows if r["kind"] == "positive"]
    store.write_table("pairs", tables.conform(pa.Table.from_pylist(pairs), "normalized_dpo_pairs"))
    store.write_table("positives", tables.conform(pa.Table.from_pylist(positives), "agreement_positives"))
    return str(root)
