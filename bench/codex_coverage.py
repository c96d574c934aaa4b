"""Real Codex rollouts -> states: how many of a rollout's assistant steps the ingest turns into states.

The steps are counted from the raw JSON here, not through ``composer_pipeline``: every ``function_call``,
``custom_tool_call`` and ``local_shell_call`` item, every assistant ``message`` item and every
``web_search_call`` (bare items of the early JSONL included). A step is covered when its line is one of
a state's ``source_lines``. Also counted: model responses (runs of assistant-side items between two
inputs: a user/developer message, a call output, a compaction) against states, calls the file never
answers, quarantine rows and their reasons, and calls in a rendered prefix (``show --json``) that have no
tool message answering them. Runs ``composer-pipeline ingest --source <source>`` and ``show --all --json``
on the folder; prints one JSON line per rollout and a total.

    OMP_NUM_THREADS=1 .venv/bin/python bench/codex_coverage.py /tmp/codexreal/sessions [--source codex|auto]

The rollouts themselves are not in the repository (other projects' files): bench/RESULTS.md names each
one's repository, path and commit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow.parquet as pq

CLI = str(Path(sys.executable).with_name("composer-pipeline"))
CALLS = {"function_call", "custom_tool_call", "local_shell_call"}
ASSISTANT_SIDE = CALLS | {"reasoning", "web_search_call"}
OUTPUTS = {"function_call_output", "custom_tool_call_output"}


def response_item(obj: dict) -> dict | None:
    if obj.get("type") == "response_item" and isinstance(obj.get("payload"), dict):
        return obj["payload"]
    if "payload" not in obj and isinstance(obj.get("type"), str):  # early JSONL: bare items
        return obj
    return None


def count_steps(path: Path) -> dict:
    """The rollout's steps (line -> kind), responses, unanswered calls and meta, from the raw lines."""
    steps: dict[int, str] = {}
    responses, in_response = 0, False
    called, answered = set(), set()
    meta: dict = {}
    for line_no, line in enumerate(path.read_bytes().split(b"\n"), 1):
        try:
            obj = json.loads(line) if line.strip() else None
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            continue
        if obj.get("type") == "session_meta" and isinstance(obj.get("payload"), dict):
            meta = obj["payload"]
        if obj.get("type") == "compacted":
            in_response = False
            continue
        item = response_item(obj)
        kind = item.get("type") if item else None
        assistant_message = kind == "message" and item.get("role") == "assistant"
        if kind in ASSISTANT_SIDE or assistant_message:
            responses += 0 if in_response else 1
            in_response = True
        elif kind in OUTPUTS or kind == "message":
            in_response = False
        if kind in CALLS:
            steps[line_no] = "call"
            called.add(item.get("call_id") or item.get("id"))
        elif assistant_message:
            steps[line_no] = "message"
        elif kind == "web_search_call":
            steps[line_no] = "web_search"
        elif kind in OUTPUTS:
            answered.add(item.get("call_id"))
    return {"steps": steps, "responses": responses, "unanswered": len(called - answered), "meta": meta}


def unanswered_in_prefixes(views: list[dict]) -> Counter:
    """Per file: calls of a rendered prefix that no tool message of that prefix answers."""
    missing: Counter = Counter()
    for view in views:
        if view.get("kind") != "state":
            continue
        answers = {m.get("tool_call_id") for m in view["prefix"] if m.get("role") == "tool"}
        for message in view["prefix"]:
            for call in message.get("tool_calls") or []:
                missing[view["source_file"]] += call.get("id") not in answers
    return missing


def measure(root: Path, source: str) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        subprocess.run(
            [CLI, "ingest", "--source", source, "--out", str(store), str(root)], check=True, capture_output=True
        )
        shown = subprocess.run([CLI, "show", "--all", "--json", "--store", str(store)], check=True, capture_output=True)
        states = pq.read_table(store / "trace_states.parquet").to_pylist()
        quarantine = pq.read_table(store / "quarantine.parquet").to_pylist()
    views = [json.loads(line) for line in shown.stdout.decode().splitlines() if line.strip()]
    missing = unanswered_in_prefixes(views)
    states_of, quarantine_of = defaultdict(list), defaultdict(list)
    for state in states:
        states_of[state["source_file"]].append(state)
    for row in quarantine:
        quarantine_of[row["source_file"]].append(row["reason"])
    rows = []
    for path in sorted(p for p in root.rglob("*.jsonl") if p.is_file()):
        rel = str(path.relative_to(root))
        counted = count_steps(path)
        covered = {line for state in states_of[rel] for line in state["source_lines"]}
        steps = counted["steps"]
        rows.append(
            {
                "file": rel,
                "cli_version": counted["meta"].get("cli_version"),
                "originator": counted["meta"].get("originator"),
                "calls": sum(kind == "call" for kind in steps.values()),
                "assistant_messages": sum(kind == "message" for kind in steps.values()),
                "steps": len(steps),
                "steps_in_states": sum(line in covered for line in steps),
                "responses": counted["responses"],
                "states": len(states_of[rel]),
                "states_with_error": sum(state["has_error"] for state in states_of[rel]),
                "calls_never_answered_in_file": counted["unanswered"],
                "unanswered_calls_in_prefixes": missing[rel],
                "quarantine": dict(Counter(quarantine_of[rel])),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="folder of rollouts (walked recursively)")
    parser.add_argument("--source", default="codex", choices=["codex", "auto"])
    args = parser.parse_args()
    rows = measure(args.root, args.source)
    for row in rows:
        print(json.dumps(row))
    total = {key: sum(row[key] for row in rows) for key in ("steps", "steps_in_states", "responses", "states")}
    total["quarantine_rows"] = sum(sum(row["quarantine"].values()) for row in rows)
    total["coverage"] = round(total["steps_in_states"] / total["steps"], 4) if total["steps"] else None
    print(json.dumps({"total": True, "files": len(rows), **total}))


if __name__ == "__main__":
    main()
