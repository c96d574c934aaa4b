from __future__ import annotations

import pytest

from composer_pipeline.cli import main
from tests.support.sessions import Session, text, tool

CWD = "/home/u/p"


def _gutter(text: str) -> str:
    return "\n".join(f"{n:>6}→{s}" for n, s in enumerate(text.split("\n"), 1))


@pytest.fixture(scope="session")
def file_tool_store(tmp_path_factory) -> str:
    """One real-shaped session: a Read, an Edit that works, an Edit of an unread file, a Read of a missing
    file twice (the second time the environment knows), ingested by the CLI."""
    root = tmp_path_factory.mktemp("ws")
    s = Session(sid="0000aaaa-0000-4000-8000-000000000001", version="2.1.38", cwd=CWD)
    s.user("tidy app.py")
    body = "a = 1\nb = 2"
    steps = [
        (tool("Read", "t1", file_path=f"{CWD}/app.py"), _gutter(body), None,
         {"type": "text", "file": {"filePath": f"{CWD}/app.py", "content": body, "numLines": 2, "startLine": 1,
                                    "totalLines": 2}}),
        (tool("Edit", "t2", file_path=f"{CWD}/app.py", old_string="a = 1", new_string="a = 10"),
         f"The file {CWD}/app.py has been updated.", None, {"filePath": f"{CWD}/app.py"}),
        (tool("Edit", "t3", file_path=f"{CWD}/util.py", old_string="x", new_string="y"),
         "<tool_use_error>File has not been read yet. Read it first before writing to it.</tool_use_error>", True,
         "Error: File has not been read yet. Read it first before writing to it."),
        (tool("Read", "t4", file_path=f"{CWD}/gone.py"), "<tool_use_error>File does not exist.</tool_use_error>", True,
         "Error: File does not exist."),
        (tool("Read", "t5", file_path=f"{CWD}/gone.py"), "<tool_use_error>File does not exist.</tool_use_error>", True,
         "Error: File does not exist."),
    ]  # fmt: skip
    for i, (call, content, is_error, tur) in enumerate(steps):
        s.assistant(call, timestamp=f"2026-01-01T00:00:{2 * i:02d}.000Z")
        s.result(call["id"], content, tur=tur, is_error=is_error, timestamp=f"2026-01-01T00:00:{2 * i + 1:02d}.000Z")
    s.assistant(text("done"), timestamp="2026-01-01T00:01:00.000Z")
    s.write(root / "traces" / "proj" / f"{s.sid}.jsonl")
    out = root / "store"
    assert main(["ingest", str(root / "traces"), "--out", str(out)]) == 0
    return str(out)
