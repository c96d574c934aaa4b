"""The typed msgspec decoder (hot path) reads every line exactly as the general orjson path does."""

from __future__ import annotations

import msgspec
import orjson
import pytest

from composer_pipeline.ingest.parser import (
    NO_RAW,
    Block,
    Message,
    Record,
    _decode,
    parse_file,
    record_from_obj,
)
from composer_pipeline.render import record_payload
from composer_pipeline.scrub import Scrubber


def _normalized(r: Record) -> tuple:
    """A record with its undecoded payloads decoded (their bytes may differ in whitespace only)."""

    def blocks(c):
        if type(c) is not list:
            return c
        return [
            (
                b.type,
                b.text,
                b.thinking,
                b.id,
                b.name,
                b.input,
                b.tool_use_id,
                b.is_error,
                orjson.loads(bytes(b.content)) if b.content else "<absent>",
            )
            for b in c
        ]

    m = r.message
    msg = None if m is None else (m.id, m.role, m.model, blocks(m.content), m.usage)
    fields = [
        getattr(r, f)
        for f in Record.__struct_fields__
        if f not in ("message", "tool_use_result", "raw", "line_no", "file")
    ]
    return (*fields, msg, orjson.loads(bytes(r.tool_use_result)) if r.tool_use_result else "<absent>")


def test_fast_and_general_paths_agree_on_every_line(corpus):
    n = general = 0
    for p in sorted(corpus.root.rglob("*.jsonl")):
        for line in p.read_bytes().splitlines():
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if type(obj) is not dict:
                continue
            slow = record_from_obj(obj)
            try:
                fast = _decode(line)
            # an unexpected type: the parser takes the general path
            except msgspec.ValidationError:
                general += 1
                continue
            assert _normalized(fast) == _normalized(slow), line[:300]
            n += 1
    assert n > corpus.expect["min_typed_lines"] and general < n / 100


@pytest.mark.parametrize(
    "line, expect",
    [
        # a wrong-typed value reads as absent; the rest of the record is kept
        (
            b'{"type":"user","uuid":7,"parentUuid":"p","message":{"role":"user","content":"hi"}}',
            dict(uuid=None, parent="p", content="hi"),
        ),
        (b'{"type":null,"uuid":"u"}', dict(type="<none>", uuid="u")),
        (b'{"type":"user","uuid":"u","timestamp":12}', dict(uuid="u", timestamp=None)),
        # content that is neither a string nor a list; non-object blocks are skipped
        (b'{"type":"user","uuid":"u","message":{"role":"user","content":{"a":1}}}', dict(content=None)),
        (
            b'{"type":"assistant","uuid":"u","message":{"content":["x",{"type":"text","text":"t"},3]}}',
            dict(texts=["t"]),
        ),
        (b'{"type":"progress","uuid":"u","data":"not an object"}', dict(data=None)),
        (b'{"type":"user","uuid":"u","message":"not an object"}', dict(message=None)),
    ],
)
def test_odd_values_take_the_general_path(tmp_path, line, expect):
    f = tmp_path / "s.jsonl"
    f.write_bytes(b'{"type":"user","uuid":"first","message":{"role":"user","content":"ok"}}\n' + line + b"\n")
    out = parse_file(f, "s.jsonl", Scrubber(), "k")
    assert not out.quarantine and [r.line_no for r in out.records] == [1, 2]
    r = out.records[1]
    assert r.raw == line
    for k, v in expect.items():
        if k == "content":
            assert (r.message.content if r.message else None) == v
        elif k == "texts":
            assert [b.text for b in r.message.content] == v and all(type(b) is Block for b in r.message.content)
        else:
            assert getattr(r, k) == v


def test_blank_lines_and_bad_lines_keep_their_numbers(tmp_path):
    f = tmp_path / "s.jsonl"
    f.write_bytes(b'{"type":"user","uuid":"a"}\n\n{"type":"user","uuid":"b"}\n{broken\n{"type":"user","uuid":"c"}')
    out = parse_file(f, "s.jsonl", Scrubber(), "k")
    assert [(r.uuid, r.line_no) for r in out.records] == [("a", 1), ("b", 3), ("c", 5)]
    assert [(q["line_no"], q["reason"].split(":")[0]) for q in out.quarantine] == [
        (2, "empty line"),
        (4, "invalid JSON"),
    ]


def test_invalid_utf8_file_is_repaired_line_by_line(tmp_path):
    f = tmp_path / "s.jsonl"
    # msgspec would skip the bad bytes inside a key it does not read; the file check catches them
    f.write_bytes(b'{"type":"user","uuid":"a","cwd":"/tmp/\xff\xfe"}\n{"type":"user","uuid":"b","cwd":"\xc3\xa9"}\n')
    out = parse_file(f, "s.jsonl", Scrubber(), "k")
    assert out.utf8_repaired == 1 and [r.uuid for r in out.records] == ["a", "b"]
    assert out.records[0].raw == '{"type":"user","uuid":"a","cwd":"/tmp/\ufffd\ufffd"}'
    assert out.records[1].raw == '{"type":"user","uuid":"b","cwd":"é"}'.encode()


def test_payload_is_stored_once_and_recoverable():
    line = (
        b'{"type":"user","uuid":"u","message":{"role":"user","content":[{"type":"tool_result",'
        b'"tool_use_id":"t","content":[{"type":"text","text":"big output"}]}]},"toolUseResult":{"stdout":"x"}}'
    )
    r = _decode(line)
    assert r.tool_use_result != NO_RAW and orjson.loads(bytes(r.tool_use_result)) == {"stdout": "x"}
    assert orjson.loads(bytes(r.message.content[0].content)) == [{"type": "text", "text": "big output"}]
    content, tur = record_payload(line.decode(), "user")
    assert content[0]["content"][0]["text"] == "big output" and tur == {"stdout": "x"}
    assert record_payload('{"type":"system","uuid":"s","content":"compacted"}', "system") == ("compacted", None)
    assert record_payload("garbage {", "damaged") == (None, None)
    assert isinstance(Message(), Message)
