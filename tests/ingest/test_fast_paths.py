"""Hot-path shortcuts in ingest equal the general code they stand in for."""

from __future__ import annotations

import itertools

from composer_pipeline.ingest.states import _has_user_parts
from composer_pipeline.render import user_parts

BLOCKS = [
    {"type": "text", "text": "hi"}, {"type": "text", "text": ""}, {"type": "text"}, {"type": "image", "source": {}},
    {"type": "tool_result", "tool_use_id": "known", "content": "ok"}, {"type": "tool_result", "tool_use_id": "orphan"},
    {"type": "tool_result"}, {"type": "document"}, {"no_type": 1}, "a bare string", None, 7,
]


def test_has_user_parts_equals_bool_of_user_parts():
    known = {"known": "Bash"}
    contents = ["", "text", None, 3, {"type": "text"}, []]
    contents += [list(c) for n in (1, 2) for c in itertools.product(BLOCKS, repeat=n)]
    for c in contents:
        assert _has_user_parts(c, known) == bool(user_parts(c, known)), c
