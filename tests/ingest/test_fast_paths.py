"""Hot-path shortcuts in ingest equal the general code they stand in for."""

from __future__ import annotations

import itertools

from composer_pipeline.ingest.parser import block_from_dict, content_from_obj
from composer_pipeline.ingest.states import _has_user_parts
from composer_pipeline.render import user_parts

BLOCKS = [
    {"type": "text", "text": "hi"},
    {"type": "text", "text": ""},
    {"type": "text"},
    {"type": "image", "source": {}},
    {"type": "tool_result", "tool_use_id": "known", "content": "ok"},
    {"type": "tool_result", "tool_use_id": "orphan"},
    {"type": "tool_result"},
    {"type": "document"},
    {"no_type": 1},
    "a bare string",
    None,
    7,
]


def test_has_user_parts_equals_bool_of_user_parts():
    known = {"known": "Bash"}
    contents = ["", "text", None, 3, {"type": "text"}, []]
    contents += [list(c) for n in (1, 2) for c in itertools.product(BLOCKS, repeat=n)]
    for c in contents:
        assert _has_user_parts(content_from_obj(c), known) == bool(user_parts(c, known)), c


def test_action_json_of_equals_action_from_blocks(corpus):
    import orjson

    from composer_pipeline.ingest.states import action_json_of
    from composer_pipeline.render import action_from_blocks

    odd = [
        [],
        [{"type": "text", "text": "  "}, {"type": "text", "text": " a "}, {"type": "text"}],
        [{"type": "thinking", "thinking": " t1 "}, {"type": "thinking"}, {"type": "redacted_thinking", "data": "x"}],
        [
            {"type": "tool_use", "id": None, "name": None, "input": "raw"},
            {"type": "tool_use", "input": [1, 2]},
            {"type": "tool_use", "id": "t", "name": "Bash", "input": {"command": "ls", "é": "ü"}},
        ],
        [{"type": "text", "text": 5}, {"type": "image"}, {"no": "type"}],
    ]
    n = 0
    for p in sorted(corpus.root.rglob("*.jsonl")):
        for line in p.read_bytes().splitlines():
            try:
                o = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            c = (
                (o.get("message") or {}).get("content")
                if isinstance(o, dict) and isinstance(o.get("message"), dict)
                else None
            )
            if o.get("type") == "assistant" and isinstance(c, list):
                odd.append([b for b in c if isinstance(b, dict)])
                n += 1
    assert n > corpus.expect["min_assistant_lines"]
    for blocks in odd:
        got, calls = action_json_of([block_from_dict(b) for b in blocks])
        action = action_from_blocks(blocks)
        assert got.decode() == action.to_json()
        assert [(c["id"], c["name"]) for c in calls] == [(c.id, c.name) for c in action.tool_calls]
