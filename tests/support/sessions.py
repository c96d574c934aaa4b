"""Synthetic Claude Code session builder for tests (real record shapes, our own content).

Used by the ingest tests and by :mod:`tests.support.traces` (the project's own corpus).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

_ids = itertools.count(1)


def uid() -> str:
    n = next(_ids)
    return f"00000000-0000-4000-8000-{n:012d}"


class Session:
    """Append records like Claude Code does; ``last`` is the uuid the next record chains to."""

    def __init__(
        self,
        sid: str = "5e5510e0-0000-4000-8000-000000000000",
        version: str = "2.1.38",
        agent_id: str | None = None,
        sidechain: bool = False,
        new_uuid=uid,
        cwd: str = "/home/u/p",
    ):
        self.sid, self.version, self.agent_id, self.side = sid, version, agent_id, sidechain
        # new_uuid: a private counter makes a corpus reproducible
        self.new_uuid, self.cwd = new_uuid, cwd
        self.lines: list[str] = []
        self.last: str | None = None
        self.n = 0

    def rec(self, typ: str, parent="LAST", **kw) -> str:
        u = kw.pop("uuid", None) or self.new_uuid()
        r = {
            "parentUuid": self.last if parent == "LAST" else parent,
            "isSidechain": self.side,
            "userType": "external",
            "cwd": self.cwd,
            "sessionId": self.sid,
            "version": self.version,
            "gitBranch": "main",
        }
        if self.agent_id:
            r["agentId"] = self.agent_id
        r.update(type=typ, **kw)
        r.setdefault("uuid", u)
        r.setdefault("timestamp", "2026-01-01T00:00:00.000Z")
        self.lines.append(json.dumps(r))
        self.last = r["uuid"]
        return r["uuid"]

    def user(self, content, parent="LAST", **kw) -> str:
        return self.rec("user", parent=parent, message={"role": "user", "content": content}, **kw)

    def assistant(self, *blocks, parent="LAST", mid: str | None = None, model: str = "claude-test", **kw) -> list[str]:
        self.n += 1
        mid = mid or f"msg_{self.agent_id or 'main'}_{self.n:03d}"
        out = []
        for i, b in enumerate(blocks):
            out.append(
                self.rec(
                    "assistant",
                    parent=parent if i == 0 else "LAST",
                    requestId=f"req_{mid}",
                    message={
                        "id": mid,
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [b],
                        "usage": {"input_tokens": 5, "output_tokens": 10 * (i + 1)},
                    },
                    **kw,
                )
            )
        return out

    def result(
        self, tool_id: str, content, tur=None, is_error: bool | None = None, parent="LAST", extra_blocks=(), **kw
    ) -> str:
        b = {"type": "tool_result", "tool_use_id": tool_id, "content": content}
        if is_error is not None:
            b["is_error"] = is_error
        if tur is not None:
            kw["toolUseResult"] = tur
        return self.user([b, *extra_blocks], parent=parent, **kw)

    def raw(self, line: str) -> None:
        self.lines.append(line)

    def obj(self, o: dict) -> None:
        self.lines.append(json.dumps(o))

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in self.lines))
        return path


def text(t: str) -> dict:
    return {"type": "text", "text": t}


def tool(name: str, tid: str, **inp) -> dict:
    return {"type": "tool_use", "id": tid, "name": name, "input": inp}


def thinking(t: str) -> dict:
    return {"type": "thinking", "thinking": t, "signature": "sig"}
