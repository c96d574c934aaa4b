"""Synthetic Claude Code sessions (2.0.x shape) for the Dagster tests, written into tmp trace roots.

A module of its own (not conftest.py) so that test files import it by a unique name: ``from conftest
import …`` resolves to whichever directory's conftest pytest loaded last when several test
directories are given on one command line."""

import json
import uuid
from pathlib import Path

SESSION_ID = "11111111-2222-3333-4444-555555555555"


def _rec(kind, parent, uid, sid, content, ts, **extra):
    rec = {
        "parentUuid": parent,
        "isSidechain": False,
        "userType": "external",
        "cwd": "/home/dev/proj",
        "sessionId": sid,
        "version": "2.0.74",
        "gitBranch": "main",
        "type": kind,
        "uuid": uid,
        "timestamp": f"2025-12-20T09:00:{ts:02d}.000Z",
        **extra,
    }
    if kind == "user":
        rec["message"] = {"role": "user", "content": content}
    else:
        rec["message"] = {
            "model": "claude-sonnet-4-5-20250929",
            "id": f"msg_{uid[:8]}",
            "type": "message",
            "role": "assistant",
            "content": content,
            "stop_reason": None,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }
        rec["requestId"] = f"req_{uid[:8]}"
    return rec


# not a real token; the scrubber must catch it
FAKE_GITHUB_TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"


def session_lines(sid: str = SESSION_ID, n_steps: int = 3, task: str = "Fix the failing test in app.py") -> list[str]:
    """A main session: user task, then ``n_steps`` (assistant tool_use -> user tool_result), then a final answer."""
    recs, parent, ts = [], None, 0
    u = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{sid}-0"))
    recs.append(_rec("user", parent, u, sid, task, ts))
    parent = u
    for i in range(n_steps):
        ts += 1
        a = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{sid}-a{i}"))
        tid = f"toolu_{i:02d}{sid[:6]}"
        recs.append(
            _rec(
                "assistant",
                parent,
                a,
                sid,
                [
                    {"type": "text", "text": f"Step {i}: let me look at the file."},
                    {
                        "type": "tool_use",
                        "id": tid,
                        "name": "Read" if i % 2 == 0 else "Bash",
                        "input": {"file_path": f"/home/dev/proj/app{i}.py"}
                        if i % 2 == 0
                        else {"command": f"pytest -q test_{i}.py"},
                    },
                ],
                ts,
            )
        )
        parent = a
        ts += 1
        r = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{sid}-r{i}"))
        recs.append(
            _rec(
                "user",
                parent,
                r,
                sid,
                [
                    {
                        "type": "tool_result",
                        "tool_use_id": tid,
                        "content": f"line {i}: def f(): return {i}"
                        + (f"\nGITHUB_TOKEN={FAKE_GITHUB_TOKEN}" if i == 0 else ""),
                    }
                ],
                ts,
                toolUseResult={"stdout": f"ok {i}"},
            )
        )
        parent = r
    ts += 1
    f = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{sid}-final"))
    recs.append(_rec("assistant", parent, f, sid, [{"type": "text", "text": "Done: the test passes now."}], ts))
    return [json.dumps(r) for r in recs]


def write_session(root: Path, project: str, sid: str, n_steps: int = 3, extra_lines: list[str] = ()) -> Path:
    d = root / project
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{sid}.jsonl"
    p.write_text("\n".join([*session_lines(sid, n_steps), *extra_lines]) + "\n")
    return p


def write_teachers_yaml(
    path: Path, url: str, *, ceiling_usd: float = 5.0, budget_usd: float = 10.0, n: int = 3, key_env: str | None = None
) -> Path:
    """``n`` keyless teachers behind one loopback server, each a distinct model name (a vote is base_url + model)."""
    import yaml

    path.write_text(
        yaml.safe_dump(
            {
                "ceiling_usd": ceiling_usd,
                "teachers": [
                    {
                        "name": f"t{i}",
                        "base_url": url,
                        "model": f"scripted-{i}",
                        "api_key_env": key_env if i == 0 else None,
                        "input_usd_per_mtok": 1.0,
                        "output_usd_per_mtok": 2.0,
                        "budget_usd": budget_usd,
                        "max_concurrency": 2,
                        "max_tokens": 64,
                        "max_retries": 0,
                        "timeout_s": 10,
                    }
                    for i in range(n)
                ],
            }
        )
    )
    return path
