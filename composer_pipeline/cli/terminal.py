"""Text bound for a terminal: control characters escaped, so stored text cannot drive the terminal.

In:  text a command prints for a person (``sql``'s table, ``show``'s and ``lineage``'s views).
Out: the same text with C0 controls (except newline and, unless ``cells``, tab), DEL and C1 controls
written as ``\\xNN``: a session key holding ``ESC ] 0 ; ... BEL`` (a file name can) would otherwise
set the window title, move the cursor or rewrite what was printed before it.
Deliberately simplified: JSON output is left to the JSON encoder (it escapes C0 controls), and CSV
is escaped only when written to a terminal (piped, it is data).
"""

from __future__ import annotations

_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)]
_TEXT = {c: f"\\x{c:02x}" for c in _CONTROLS if c not in (0x0A, 0x09)}
_CELL = {c: f"\\x{c:02x}" for c in _CONTROLS} | {0x0A: "\\n", 0x09: "\\t"}


def safe(text: str, cells: bool = False) -> str:
    """``text`` with control characters escaped; ``cells``: newlines and tabs too (one table cell)."""
    return text.translate(_CELL if cells else _TEXT)
