"""Generated DPO pairs for the normalization benchmark and tests (no real traces needed).

In:  a row count and a seed. Out: a ``dpo_pairs`` table shaped like real output: nested JSON
prompts of varying length, tool-call and text completions, plus the cases the default recipe
must drop: a too-short *rejected* side alone, special-character junk on either side, exact
duplicate pairs. Deliberately simplified: texts come from small templates, not real sessions.
"""

from __future__ import annotations

import hashlib
import random

import orjson
import pyarrow as pa

from composer_pipeline import tables
from composer_pipeline.actions import Action, ToolCall

_FILES = ["src/app.py", "src/db/models.py", "tests/test_api.py", "README.md", "pkg/util/strings.go", "web/index.ts"]
_CMDS = ["pytest -x -q", "git status", "ls -la", "npm test", "go build ./...", "ruff check .", "cat setup.cfg"]
_WORDS = "the a fix bug test file read run check update import module function error value config path".split()


def _action(rng: random.Random) -> Action:
    r = rng.random()
    if r < 0.35:
        return Action(tool_calls=(ToolCall("Read", {"file_path": "/repo/" + rng.choice(_FILES)}, id="c0"),))
    if r < 0.65:
        return Action(
            text=rng.choice(["", "Running the tests."]),
            tool_calls=(ToolCall("Bash", {"command": rng.choice(_CMDS)}, id="c0"),),
        )
    if r < 0.8:
        f = rng.choice(_FILES)
        return Action(
            tool_calls=(
                ToolCall(
                    "Edit",
                    {"file_path": "/repo/" + f, "old_string": "x = 1", "new_string": f"x = {rng.randint(2, 99)}"},
                    id="c0",
                ),
            )
        )
    return Action(text=" ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 60))).capitalize() + ".")


def synthetic_pairs(n: int, seed: int = 0) -> pa.Table:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        state_id = hashlib.sha256(f"state|{seed}|{i}".encode()).hexdigest()[:20]
        prompt = [{"role": "system", "content": "You are a coding agent."}]
        for t in range(rng.randint(1, 6)):
            prompt.append({"role": "user", "content": " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 40)))})
            a = _action(rng)
            prompt.append(a.to_chat_message())
            if a.tool_calls:
                prompt.append({"role": "tool", "tool_call_id": "c0", "content": "ok " * rng.randint(1, 30)})
        chosen, rejected = _action(rng), _action(rng)
        chosen_text, rejected_text = chosen.to_text(), rejected.to_text()
        kind = rng.random()
        if kind < 0.05:
            # rejected side alone fails text_length_filter (min_len 2)
            rejected_text = "?"
        elif kind < 0.08:
            chosen_text = "}{" * rng.randint(5, 40) + "<<>>##$$"  # special-character junk
        elif kind < 0.10:
            rejected_text = "@@@###$$$%%%^^^&&&***" * rng.randint(1, 5)
        sig = f"tool:{i}"
        row = {
            "pair_id": hashlib.sha256(f"{state_id}|{sig}".encode()).hexdigest()[:20],
            "kind": "pair",
            "state_id": state_id,
            "session_key": f"proj__session{i % 50}",
            "partition_key": f"proj/session{i % 50}",
            "session_id": f"sess-{i % 50}",
            "source_file": f"proj/session{i % 50}.jsonl",
            "source_lines": [2 * i + 1, 2 * i + 2],
            "record_uuids": [f"uuid-{i}-a", f"uuid-{i}-b"],
            "replay_call_ids": sorted(hashlib.sha256(f"{state_id}|{t}".encode()).hexdigest() for t in "abc"),
            "prompt": orjson.dumps(prompt).decode(),
            "tools": orjson.dumps([{"type": "function", "function": {"name": "Read", "parameters": {}}}]).decode(),
            "chosen": chosen.to_json(),
            "rejected": rejected.to_json(),
            "chosen_text": chosen_text,
            "rejected_text": rejected_text,
            "agreement_kind": "cross_model",
            "n_teachers": 3,
            "n_models": 3,
            "n_agreeing": rng.choice([2, 3]),
            "agreeing_teachers": ["alpha", "beta"],
            "agreement_score": 0.67,
            "consensus_signature": sig,
            "agent_signature": f"tool:agent{i}",
            "cost_usd": round(rng.random() / 1000, 6),
            "has_error": rng.random() < 0.2,
            "error_after": None,
        }
        row["n_models_agreeing"] = row["n_agreeing"]
        # exact duplicate of an earlier pair's content
        if i > 10 and rng.random() < 0.04:
            src = rows[rng.randrange(len(rows))]
            for k in ("prompt", "chosen", "rejected", "chosen_text", "rejected_text"):
                row[k] = src[k]
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=tables.DPO_PAIRS)
