"""The compiled ingest engine (native.py, csrc/) reproduces the Python reference exactly.

The other ingest tests already run both engines on every fixture (engines.ingest_checked). Here:
the helpers the C++ code relies on are checked against Python itself (str.strip, orjson/msgspec
re-serialization, SHA-256, UTF-8), the hand-back to Python is exercised, rows batched over many
sessions equal the per-session tables, and a seeded fuzzer mutates the corpora's sessions and synthetic
ones (broken lines, odd value types, repeated keys, escapes, numbers, cycles, keys planted behind every
boundary a decoded string has) and compares the engines; no planted key may survive in any table.
"""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import sys
from pathlib import Path

import msgspec
import orjson
import pyarrow as pa
import pytest

from composer_pipeline.ingest import native
from composer_pipeline.ingest.config import IngestRecipe
from composer_pipeline.ingest.discover import discover_sessions
from composer_pipeline.ingest.pipeline import TABLES, SessionIngester, ingest_session
from tests.support.sessions import Session, text, thinking, tool, uid

from .damage import MODES, damage_line
from .engines import ingest_checked
from .test_secret_corpus import KEYS

needs_native = pytest.mark.skipif(not native.AVAILABLE, reason=f"native engine not built: {native.IMPORT_ERROR}")


def test_native_engine_is_built_where_a_compiler_is():
    """pyproject.toml builds the extension as optional; on this platform (and CI) it must be there, so
    the engine tests below run rather than skip."""
    if sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64") and shutil.which("g++"):
        assert native.AVAILABLE, native.IMPORT_ERROR
    assert IngestRecipe().engine == "auto"
    assert SessionIngester().engine == ("native" if native.AVAILABLE else "python")


# ---- the helpers, against Python ------------------------------------------------------------------------
@needs_native
def test_strip_and_isspace_match_python_on_every_code_point():
    spaces = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c < 0xE000 and chr(c).isspace()]
    assert len(spaces) == 29
    for ch in spaces:
        assert native.py_strip(f"{ch}a{ch}b{ch}{ch}") == f"a{ch}b"
    others = [chr(c) for c in range(0, 0x3100) if not chr(c).isspace() and not 0xD800 <= c < 0xE000]
    for ch in others + ["\U0001f600", "\u200b", "\ufeff"]:
        assert native.py_strip(f" {ch} ") == ch
    rng = random.Random(3)
    pool = spaces + ["a", "é", "\u4e2d", "\U0001f600", "\x00"]
    for _ in range(2000):
        s = "".join(rng.choice(pool) for _ in range(rng.randint(0, 8)))
        assert native.py_strip(s) == s.strip(), repr(s)


def test_no_non_ascii_code_point_lowers_to_e_r_or_o():
    """contains_error_ci (json.h) folds ASCII only: exact for ``"error" in s.lower()`` because of this."""
    for c in range(0x80, sys.maxunicode + 1):
        if 0xD800 <= c < 0xE000:
            continue
        low = chr(c).lower()
        assert low and not any(x in low for x in "ero"), hex(c)


@needs_native
def test_canonicalize_json_bytes_equals_orjson_of_msgspec():
    values = [
        None,
        True,
        False,
        0,
        -0,
        1,
        -1,
        2**63 - 1,
        -(2**63),
        2**64 - 1,
        "",
        "plain",
        'q"uo\\te',
        "\x00\x01\x1f\x7f",
        "\b\f\n\r\t",
        "é\u2028\U0001f600",
        [],
        {},
        [1, [2, [3, {"a": [None]}]]],
        {"k": "v", "n": {"m": []}},
        {"input_tokens": 5, "cache_creation": {"ephemeral_5m_input_tokens": 0}, "service_tier": "standard"},
    ]
    texts = [orjson.dumps(v) for v in values] + [json.dumps(v).encode() for v in values]
    texts += [json.dumps(v, indent=2).encode() for v in values]  # whitespace, \\u escapes of non-ASCII
    texts += [b'"\\/\\u00e9\\u00E9\\u001F\\u001f\\u000a\\ud83d\\ude00"', b"-0", b" [ 1 , 2 ] ", b'{"a" : "\\u0041"}']
    for t in texts:
        got = native.canonicalize_json_bytes(t)
        assert got == orjson.dumps(msgspec.json.decode(t)), t
    # where only Python can say, the native side declines (the session is handed back)
    for t in (
        b"1.5",
        b"1e3",
        b"[0.0]",
        b"18446744073709551616",
        b"-9223372036854775809",
        b'{"a":1,"a":2}',
        b'{"\\u0061":1,"a":2}',
    ):
        assert native.canonicalize_json_bytes(t) is None, t
    rng = random.Random(5)
    for _ in range(300):
        v = _random_json(rng, 3)
        t = json.dumps(v, ensure_ascii=rng.random() < 0.5).encode()
        assert native.canonicalize_json_bytes(t) == orjson.dumps(msgspec.json.decode(t)), t


def _random_json(rng: random.Random, depth: int):
    r = rng.random()
    if depth == 0 or r < 0.4:
        return rng.choice([None, True, False, 0, 7, -12, 2**62, "", "x", "tab\there", "é😀", "\x1b[0m", 'a"b\\c'])
    if r < 0.7:
        return [_random_json(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice("abcdefgh") + str(i): _random_json(rng, depth - 1) for i in range(rng.randint(0, 3))}


@needs_native
def test_sha256_and_utf8_validation_match_python():
    import hashlib

    rng = random.Random(9)
    for n in list(range(130)) + [1000, 4096]:
        data = bytes(rng.getrandbits(8) for _ in range(n))
        # SHA-NI where the CPU has it, and the portable rounds
        for portable in (False, True):
            assert native.sha256_hex(data, portable) == hashlib.sha256(data).hexdigest()
    samples = [
        b"",
        b"ascii",
        "é😀中".encode(),
        b"\xff",
        b"\xc0\x80",
        b"\xed\xa0\x80",
        b"\xf4\x90\x80\x80",
        b"\xe2\x82",
        b"x" * 40 + b"\xe2\x82\xac" + b"y" * 40,
        b"a" * 33 + b"\x80",
    ]
    samples += [bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 40))) for _ in range(3000)]
    for s in samples:
        try:
            s.decode("utf-8")
            ok = True
        except UnicodeDecodeError:
            ok = False
        assert native.utf8_valid(s) == ok, s


@needs_native
def test_native_reader_never_accepts_a_line_the_reference_rejects():
    """Lines orjson refuses (and msgspec too, or the reference would keep a record) must not be read
    natively; the reverse (native stricter) is allowed: Python then decides."""
    lines = [
        b'{"type":"user","x":1e400}',
        b'{"type":"user","x":-1e400}',
        b'{"type":"user","x":"\\ud800"}',
        b'{"type":"user","x":"\\udc00"}',
        b'{"type":"user","x":"\\q"}',
        b'{"type":"user","x":"a\x01"}',
        b'{"type":"user","x":[1,]}',
        b'{"type":"user","x":01}',
        b'{"type":"user","x":1.}',
        b'{"type":"user",}',
        b'{"type":"user"} x',
        b"[1]",
        b'"s"',
        b"",
        b"   ",
        b'{"type":"user","x":' + b"[" * 300 + b"]" * 300 + b"}",
        b'{"type":"user","x":1e308}',
        b'{"type":"user","x":1e-400}',
        b'{"type":"user"}\r',
        b' {"a":1} ',
    ]
    for line in lines:
        try:
            orjson.loads(line)
            ref_ok = True
        except orjson.JSONDecodeError:
            ref_ok = False
        if native.reads_line(line):
            assert ref_ok, line


# ---- the engines on whole sessions ---------------------------------------------------------------------
@needs_native
def test_invalid_utf8_session_is_handed_to_python(tmp_path):
    s = Session()
    s.user("hi")
    s.assistant(text("ok"))
    s.raw('{"type":"user","uuid":"u-bad","message":{"role":"user","content":"caf\udcff"}}')
    p = tmp_path / "p" / "s.jsonl"
    p.parent.mkdir(parents=True)
    p.write_bytes("\n".join(s.lines[:2]).encode() + b'\n{"type":"user","uuid":"u-bad","cwd":"\xff"}\n')
    (sf,) = discover_sessions(tmp_path)
    res = ingest_checked(sf)
    assert res.engine == "python" and "UTF-8" in res.fallback_reason
    assert res.file_reports[0]["utf8_repaired"] == 1


@needs_native
def test_a_line_only_python_reads_hands_the_session_back(tmp_path):
    s = Session()
    s.user("hi")
    s.assistant(text("ok"))
    # nested deeper than the native reader goes, yet within msgspec's and orjson's limits
    s.raw('{"type":"user","uuid":"' + uid() + '","x":' + "[" * 250 + "]" * 250 + "}")
    (sf,) = discover_sessions(Path(s.write(tmp_path / "p" / "s.jsonl")).parent.parent)
    res = ingest_checked(sf)
    assert res.engine == "python" and res.fallback_reason == "a line only the Python reader accepts"


@needs_native
def test_floats_in_tool_input_hand_the_session_back_with_the_reason(tmp_path):
    s = Session()
    s.user("sleep a bit")
    s.assistant(tool("Bash", "t1", command="sleep", timeout=1.5))
    (sf,) = discover_sessions(Path(s.write(tmp_path / "p" / "s.jsonl")).parent.parent)
    res = ingest_checked(sf)
    assert res.engine == "python" and "re-serialize" in res.fallback_reason
    assert json.loads(res.states.to_pylist()[0]["action"])["tool_calls"][0]["arguments"]["timeout"] == 1.5


@needs_native
def test_batched_rows_equal_per_session_tables(corpus, repo_root):
    """The CLI gathers many sessions (and a Python fallback among them) into one builder: the rows
    come out in session order, equal to the per-session tables."""
    roots = [corpus.root, repo_root / "composer_pipeline" / "samples" / "projects"]
    sfs = [sf for r in roots for sf in discover_sessions(r)]
    ing = SessionIngester(engine="native")
    reports = [ing.add(sf) for sf in sfs]
    batched = ing.take()
    per = [ingest_session(sf, engine="python") for sf in sfs]
    for name, attr in zip(TABLES, ("states", "messages", "quarantine")):
        expect = pa.concat_tables([getattr(r, attr) for r in per])
        assert batched[name].equals(expect), name
    assert [r.file_reports for r in reports] == [r.file_reports for r in per]
    assert {r.engine for r in reports} == {"native"}
    assert ing.take()["trace_messages"].num_rows == 0  # taken: the builder starts empty


@needs_native
def test_scrubbed_lines_are_read_in_place_and_a_splice_must_be_a_whole_line(tmp_path):
    """The native engine reads a file that holds a key as (file, the scrubber's changed lines) without the
    spliced copy: the rows equal those of the spliced file (the Python engine ingests that). A splice
    that is not one whole line, in order, is refused."""
    from composer_pipeline.scrub import Scrubber, apply_splices

    s = Session()
    key = {kind: KEYS[kind][0] for kind in ("github_token", "anthropic_key", "jwt", "slack_token", "aws_access_key")}
    s.user("first\n" + key["github_token"])
    s.assistant(text("ok\t" + key["anthropic_key"]), tool("Bash", "t1", command="echo " + key["jwt"]))
    s.result("t1", "done")
    s.raw('{"parentUuid":"x","type":"user","message":{"role":"user","content":"cut ' + key["slack_token"])
    s.assistant(text("last " + key["aws_access_key"]))
    path = tmp_path / "p" / "s.jsonl"
    s.write(path)
    (sf,) = discover_sessions(tmp_path)
    data = path.read_bytes()
    splices = Scrubber().line_splices(data)
    assert len(splices) >= 4 and splices[-1][1] in (len(data), len(data) - 1)
    # native (in place) == python (spliced bytes)
    res = ingest_checked(sf)
    assert res.engine == "native" and res.quarantine.num_rows == 1
    stored = str([res.states.to_pylist(), res.messages.to_pylist(), res.quarantine.to_pylist()])
    assert not any(KEYS[kind][1] in stored for kind in key)
    assert apply_splices(data, splices).count(b"\n") == data.count(b"\n")

    def add(sp):
        spec = ("p/s.jsonl", data, sp, True, None, None, None, None)
        return native.Builder().add_session(
            sf.key, "s", [spec], lambda *a: ("damaged", "", None, None, False, False, None), False, True
        )

    start, end, line = splices[0]
    for bad in (
        [(start + 1, end, line)],
        [(start, end - 1, line)],
        [(start, end, line + b"\n")],
        [splices[1], splices[0]],
        [(start, end, line), (start, end, line)],
        [(-1, end, line)],
        [(start, len(data) + 1, line)],
    ):
        with pytest.raises(ValueError, match="whole line"):
            add(bad)
    assert add(splices)[0] is True


# ---- fuzz: mutated sessions -------------------------------------------------------------------------------
ODD = [None, 0, 1, -0.0, 1.5, "", "x", "Task", [], {}, [1], {"a": 1}, True, False, 2**70, "\u2028 \x00"]
TOP_KEYS = [
    "type",
    "uuid",
    "parentUuid",
    "logicalParentUuid",
    "isSidechain",
    "isMeta",
    "isCompactSummary",
    "subtype",
    "sessionId",
    "timestamp",
    "version",
    "requestId",
    "isApiErrorMessage",
    "parentToolUseID",
    "message",
    "toolUseResult",
    "data",
    "attachment",
    "@damaged",
]
MSG_KEYS = ["id", "role", "model", "content", "usage"]
BLOCK_KEYS = ["type", "text", "thinking", "id", "name", "input", "tool_use_id", "is_error", "content"]
RAW_VALUES = [
    "1e400",
    "-1e400",
    "1e-400",
    "123456789012345678901234567890",
    "-0",
    "1E2",
    '"\\ud83d\\ude00"',
    '"\\u00e9\\/x"',
    '"\\u0041"',
    '"Warmup"',
    '" Warmup\\n"',
    '"ERROR: failed"',
    '{"agentId":"ag1"}',
]


# keys planted into string values behind each boundary a decoded string has (JSON escapes once written);
# the whole key is the fragment looked for (a line cut inside a key leaves an incomplete one, which no
# pattern can tell from text), for a private key its last body line (its header is redacted with the rest)
BOUNDARIES = [
    "",
    "\n",
    "\t",
    "\r\n",
    "\r",
    "\b",
    "\f",
    "\u00e9",
    "\u2192",
    "\x00",
    "\\",
    '"',
    "=",
    ": ",
    "Bearer ",
    "export X=",
    "\\n",
]
PLANT_FRAGMENTS = [k if kind != "private_key" else "QkLmNoPq==" for kind, (k, _) in KEYS.items()]


def _planted(rng: random.Random) -> str:
    v = rng.choice(BOUNDARIES) + rng.choice(list(KEYS.values()))[0] + rng.choice(["", "\n", '"', " tail", "\u00e9"])
    # a JSON document in a string (a tool input that is JSON)
    for _ in range(rng.choice([0, 0, 1, 2])):
        v = json.dumps({"in": v} if rng.random() < 0.5 else v, ensure_ascii=rng.random() < 0.5)
    return v


def _synthetic_sessions(root: Path, rng: random.Random) -> None:
    """A main session with every feature ingest handles, inline sidechains, and agent files."""
    sid = "f0220000-0000-4000-8000-00000000000%d" % rng.randint(0, 9)
    m = Session(sid, rng.choice(["1.0.98", "2.0.74", "2.1.38"]))
    m.obj({"type": "summary", "summary": "s", "leafUuid": "nowhere"})
    m.user("fix the bug  ")
    m.assistant(thinking(" plan "), text("looking\n"), tool("Read", "r1", file_path="a.py"))
    m.result("r1", "file text", tur="Error: File has not been read yet")
    m.assistant(
        text("   "),
        tool("Task", "task1", prompt="  explore the repo  ", description="d"),
        tool("Task", "task2", prompt="second", description="d"),
    )
    m.result("task1", [{"type": "text", "text": "done"}], tur={"agentId": "ab1", "status": "completed"})
    m.rec("progress", data={"type": "agent_progress", "agentId": "cd2"}, parentToolUseID="task2")
    m.rec("attachment", attachment={"type": "file"})
    b = m.rec("system", subtype="compact_boundary", parent=None, logicalParentUuid=m.last)
    m.user("summary of before", isCompactSummary=True)
    m.user("<command-name>x</command-name>", isMeta=True)
    m.assistant(tool("Bash", "b1", command="ls"), tool("Bash", "b2", command="pwd"))
    m.result("b1", [{"type": "text", "text": "out"}, {"type": "image"}, {"x": 1}, "s"], is_error=True)
    m.result("b2", "fine", extra_blocks=[{"type": "text", "text": "also"}])
    m.assistant(text("api failed"), model="<synthetic>", isApiErrorMessage=True)
    m.user([{"type": "tool_result", "tool_use_id": "lost", "content": "orphan"}])
    m.assistant(text("done"))
    side = Session(sid, "1.0.98", sidechain=True)
    side.user("explore the repo", parent=None)
    side.assistant(text("exploring"))
    m.lines += side.lines
    if rng.random() < 0.5:
        m.raw('{"parentUuid":"%s","type":"user","uuid":"%s","message":{"role":"user","content":"cut' % (b, uid()))
    # a tool result on a damaged line (salvaged): cut mid-content, or garbled at its end
    if rng.random() < 0.5:
        m.assistant(tool("Bash", "b3", command="cat log"))
        m.result("b3", "log line\n" * 3)
        t = m.lines[-1]
        m.lines[-1] = t[: t.index("log line") + rng.randint(0, 20)] if rng.random() < 0.5 else t.rstrip("}")
        m.assistant(text("after the damaged result"))
    m.write(root / "proj" / f"{sid}.jsonl")
    a = Session(sid, "2.0.74", agent_id="ab1", sidechain=True)
    a.user("Warmup" if rng.random() < 0.3 else "explore")
    a.assistant(text("agent text"), tool("Grep", "g1", pattern="x"))
    a.write(root / "proj" / "agent-ab1.jsonl")
    c = Session(sid, "2.1.38", agent_id="cd2", sidechain=True)
    c.user([{"type": "text", "text": "second"}])
    c.assistant(text("sub"))
    c.write(root / "proj" / sid / "subagents" / "agent-cd2.jsonl")


def _mutate_line(line: str, rng: random.Random, uuids: list[str]) -> str:
    r = rng.random()
    if r < 0.08:
        return line[: rng.randint(0, len(line))]
    if r < 0.11:
        return rng.choice(
            [
                "",
                "   ",
                "[1,2]",
                "null",
                "garbage {",
                '{"uuid":"%s","parentUuid":"%s"' % (rng.choice(uuids), rng.choice(uuids)),
            ]
        )
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return line
    if not isinstance(obj, dict):
        return line
    target, keys = obj, TOP_KEYS
    msg = obj.get("message")
    if isinstance(msg, dict) and rng.random() < 0.5:
        target, keys = msg, MSG_KEYS
        content = msg.get("content")
        if isinstance(content, list) and content and rng.random() < 0.6:
            b = rng.choice(content)
            if isinstance(b, dict):
                target, keys = b, BLOCK_KEYS
    key = rng.choice(keys)
    r = rng.random()
    raw_value = None
    if r < 0.45:
        target[key] = rng.choice(ODD)
    elif r < 0.6 and key in ("uuid", "parentUuid", "logicalParentUuid", "tool_use_id", "id", "agentId"):
        target[key] = rng.choice(uuids)
    elif r < 0.7:
        target.pop(key, None)
    elif r < 0.85:
        target[rng.choice([key, "text", "thinking", "content", "input"])] = _planted(rng)
    else:
        raw_value = rng.choice(RAW_VALUES)
        target[key] = "@@RAW@@"
    out = json.dumps(obj, ensure_ascii=rng.random() < 0.5, separators=(",", ":") if rng.random() < 0.7 else None)
    if raw_value is not None:
        out = out.replace('"@@RAW@@"', raw_value, 1)
    if rng.random() < 0.1:  # a repeated key: the last one wins
        k = rng.choice(["uuid", "type", "isSidechain", "message", "parentUuid"])
        out = out[:-1] + (", " if len(out) > 2 else "") + f'"{k}":' + json.dumps(rng.choice(ODD + uuids)) + "}"
    return out


def _fuzz_round(tmp: Path, rng: random.Random, corpus_root: Path) -> list:
    base = tmp / "base"
    if rng.random() < 0.5:
        _synthetic_sessions(base, rng)
    else:
        shutil.copytree(corpus_root, base, dirs_exist_ok=True)
    files = sorted(base.rglob("*.jsonl"))
    uuids = []
    for f in files:
        for line in f.read_text().splitlines():
            u = line.find('"uuid":"')
            if u != -1:
                uuids.append(line[u + 8 : u + 44])
    uuids = uuids or ["none"]
    for f in rng.sample(files, k=min(len(files), rng.randint(1, 4))):
        lines = f.read_text().splitlines()
        for _ in range(rng.randint(1, 6)):
            if not lines:
                break
            i = rng.randrange(len(lines))
            op = rng.random()
            if op < 0.65:
                lines[i] = _mutate_line(lines[i], rng, uuids)
            # 1 to 3 damaged lines in a row: cut, parent garbled or missing (damage.py)
            elif op < 0.75:
                for j in range(i, min(i + rng.randint(1, 3), len(lines))):
                    lines[j] = damage_line(lines[j], rng.choice(MODES), rng) or lines[j]
            elif op < 0.85:
                del lines[i]
            elif op < 0.95:
                j = rng.randrange(len(lines))
                lines[i], lines[j] = lines[j], lines[i]
            else:
                lines.insert(i, lines[i])
        body = "\n".join(lines) + ("\n" if rng.random() < 0.8 else "")
        f.write_text(body)
    recipe = IngestRecipe.from_dict(
        {"render": {"compaction": rng.choice(["after", "full"])}, "drop_warmup": rng.random() < 0.8}
    )
    out = []
    for sf in discover_sessions(base):
        res = ingest_checked(sf, recipe)
        out.append(res.engine)
        stored = str([res.states.to_pylist(), res.messages.to_pylist(), res.quarantine.to_pylist()])
        assert not [f for f in PLANT_FRAGMENTS if f in stored], sf.key
    shutil.rmtree(base)
    return out


@pytest.mark.slow
@needs_native
def test_engines_agree_on_mutated_sessions(tmp_path, corpus):
    rng = random.Random(int(os.environ.get("COMPOSER_FUZZ_SEED", "20261124")))
    engines = []
    for _ in range(int(os.environ.get("COMPOSER_FUZZ_ROUNDS", "120"))):
        engines += _fuzz_round(tmp_path, rng, corpus.root)
    # the comparison only means something if most sessions really ran natively
    assert engines.count("native") > 0.6 * len(engines), (engines.count("native"), len(engines))


def test_a_build_older_than_its_sources_is_refused(tmp_path):
    """An in-place build left over from before a pull or checkout that changed the C++ must not run
    (its rules could differ from the Python reference): native.py compares modification times."""
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    for name in ("json.h", "module.cpp", "notes.txt"):
        (csrc / name).write_text(name)
    module = tmp_path / "_native.so"
    module.write_bytes(b"")
    os.utime(csrc / "json.h", (1_000, 1_000))
    os.utime(csrc / "module.cpp", (1_000, 1_000))
    os.utime(csrc / "notes.txt", (9_000, 9_000))  # not a source
    os.utime(module, (5_000, 5_000))
    assert native.stale_sources(module, csrc) == []
    os.utime(csrc / "json.h", (6_000, 6_000))
    assert native.stale_sources(module, csrc) == ["json.h"]
    assert native.stale_sources(module, tmp_path / "absent") == []  # a wheel install ships no sources
    if native.AVAILABLE:  # the build in use is current
        assert native.stale_sources(native._native.__file__) == []
