"""The secret corpus: every built-in kind x every position a key takes in a real session -> 0 hits.

Generated here (project-owned, fake keys): each kind is planted at a line start, after a tab, after
``=``, ``: `` and ``Bearer ``, inside quotes, at the end of a string, after an escaped non-ASCII
character, inside a JSON-in-JSON tool input (and JSON-in-JSON-in-JSON), in tool output (``cat .env``
as the tool result and in ``toolUseResult``), in a thinking block, in a subagent file and in a
damaged (truncated) line; once written as ``json.dumps`` writes (non-ASCII escaped) and once as
Claude Code writes (raw UTF-8). Both engines run the ``ingest`` CLI; every Parquet table (decoded
down to nested JSON strings) and the prefix ``show --json`` prints must hold no fragment of any key
and no match of any pattern, while the near misses (``task-id``, ids holding ``xox``, a git SHA,
...) come through unchanged.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from composer_pipeline.cli import main
from composer_pipeline.ingest import native
from composer_pipeline.ingest.discover import discover_sessions
from composer_pipeline.scrub import KINDS, Scrubber
from tests.support.sessions import Session, text, thinking, tool

from .engines import ingest_checked

# kind -> (the key as it appears, a fragment that must not survive anywhere). All fake.
KEYS = {
    "aws_access_key": ("AKIAQWERTYUIOPASDFGH", "QWERTYUIOPASDFGH"),
    "aws_secret_key": ("AWS_SECRET_ACCESS_KEY=Zx8Cv7Bn6Mq5Wr4Et3Yu2Io1Pa9Sd8Fg7Hj6Kl5Q", "Zx8Cv7Bn6Mq5Wr4Et3Yu2Io1"),
    "github_token": ("ghp_" + "Gh7Tk3Nq9Vb2" * 3, "Gh7Tk3Nq9Vb2Gh7Tk3"),
    "anthropic_key": ("sk-ant-api03-" + "An7Th9Rp4Ck2" * 3, "An7Th9Rp4Ck2An7Th9"),
    "openai_key": ("sk-proj-" + "Op3nA1Ky8Zq5" * 3, "Op3nA1Ky8Zq5Op3nA1"),
    "slack_token": ("xoxb-1234567890-0987654321-Sl4ckT0k3nVal", "0987654321-Sl4ckT0k3n"),
    "google_api_key": ("AIza" + "Go0gL3kEy9Xw7Vu5Ts3Rq1Po9Nm7Lk5Jh3G", "Go0gL3kEy9Xw7Vu5Ts3R"),
    "jwt": ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjb3JwdXMtdXNlciJ9.Jw7Sig9Nat8Ure6Val", "eyJzdWIiOiJjb3JwdXMtdXNlciJ9"),
    "private_key": (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEpPr1vAt3K3yB0dy\nQkLmNoPq==\n-----END RSA PRIVATE KEY-----",
        "MIIEpPr1vAt3K3yB0dy",
    ),
    "password_assignment": ("DB_PASSWORD=Pw9Corpus7Hunter", "Pw9Corpus7Hunter"),
}
# hidden spellings: an invisible character inside (pasted from a web page or a chat), a letter as an
# HTML entity; the fragments are what is left of the key around the hidden character
HIDDEN = [
    ("aws_access_key", "AKIAZW5P\u200bHIDD3N0KEY12", "HIDD3N0KEY12"),
    ("github_token", "ghp_" + "So7Ft2Hy9Ph4" + "\u00ad" + "So7Ft2Hy9Ph4" * 2, "So7Ft2Hy9Ph4So7Ft2"),
    ("anthropic_key", "sk-ant-api03-Zw7Sp4Ce1In\u200bSi6De8Ke3Yz" + "Zw7Sp4Ce1In" * 2, "Si6De8Ke3YzZw7Sp4"),
    ("aws_access_key", "&#65;KIAENT1TYENC0DED9XY", "ENT1TYENC0DED9XY"),
    ("aws_access_key", "&#x41;SIAHEXENT1TY0ENC9AB", "HEXENT1TY0ENC9AB"),
]
# every other form a built-in pattern accepts (an alternation or optional prefix), each at every position
# too: a form no test plants is a form nobody knows leaks (github_pat_ did, until this list)
VARIANTS = [
    ("aws_access_key", "ASIAZXCVBNMLKJHGFDSA", "ZXCVBNMLKJHGFDSA"),
    ("github_token", "github_pat_11Fg7Pat9Xy0_" + "Fg7Pat9Xy0" * 4, "Fg7Pat9Xy0Fg7Pat9Xy0"),
    ("github_token", "gho_" + "Oa7Th2Ok9Zz1" * 3, "Oa7Th2Ok9Zz1Oa7Th2"),
    ("openai_key", "sk-" + "Le9Gy4Cy7Ke2" * 4, "Le9Gy4Cy7Ke2Le9Gy4"),
    ("openai_key", "sk-svcacct-" + "Sv5Ac7Ct3Kq8" * 3, "Sv5Ac7Ct3Kq8Sv5Ac7"),
    ("slack_token", "xoxp-2222222222-3333333333-Pe7Rs0nAlTok", "3333333333-Pe7Rs0nAl"),
    ("slack_token", "https://hooks.slack.com/services/T0AB12CD3/B0EF45GH6/Wh9Ook5Sl4ck8Url", "Wh9Ook5Sl4ck8Url"),
    ("password_assignment", "API_KEY=Ak9Assign4Value", "Ak9Assign4Value"),
    ("password_assignment", "client_secret: Cs8Assign3Value", "Cs8Assign3Value"),
    # URL-encoded keys: the token formats are made of characters URL encoders keep (letters, digits,
    # ``-_.``), so only these forms change under encoding
    (
        "slack_token",
        "https%3A%2F%2Fhooks.slack.com%2Fservices%2FT0AB12CD3%2FB0EF45GH6%2FUr1Enc0dedHo0k9",
        "Ur1Enc0dedHo0k9",
    ),
    ("password_assignment", "DB_PASSWORD%3DPw9UrlEnc0ded7", "Pw9UrlEnc0ded7"),
    ("password_assignment", "%22api_key%22%3A%22Ak9UrlEnc0ded3%22", "Ak9UrlEnc0ded3"),
    # encoded twice (a URL inside a query parameter: ``%`` -> ``%25``)
    (
        "slack_token",
        "https%253A%252F%252Fhooks.slack.com%252Fservices%252FT0AB12CD3%252FB0EF45GH6%252FTw1ceEnc0dedHo0k",
        "Tw1ceEnc0dedHo0k",
    ),
    ("password_assignment", "DB_PASSWORD%253DPw9Tw1ceEnc0ded", "Pw9Tw1ceEnc0ded"),
    *HIDDEN,
]
SAMPLES = [(kind, key, frag) for kind, (key, frag) in KEYS.items()] + VARIANTS  # (kind, key, fragment)
PER_KIND = {kind: sum(1 for k, _, _ in SAMPLES if k == kind) for kind in KEYS}
FRAGMENTS = [frag for _, _, frag in SAMPLES] + ["QkLmNoPq=="]

# decoded text positions; {k} is the key
POSITIONS = {
    "whole string": "{k}",
    "line start": "first line\n{k}\nlast line",
    "after tab": "NAME\t{k}",
    "after =": "export TOKEN={k}",
    "after colon": "token: {k}",
    "after Bearer": "curl -H 'Authorization: Bearer {k}' https://api.example.com",
    "double quotes": 'key = "{k}"',
    "single quotes": "key = '{k}'",
    "end of string": "the key is {k}",
    "after CR": "line one\r\n{k}",
    "after escaped non-ASCII": "pfeil\u2192{k}",
    "after backslash": "C:\\keys\\{k}",
    # after a URL's percent-escape (a curl command, a logged URL): the escape ends in a hex digit
    "after %20": "curl 'https://api.example.com/search?q=key%20{k}'",
    "after %2F": "GET /v1/keys%2F{k} HTTP/1.1",
    "after %3D": "next=%3Ftoken%3D{k}",
    "after %3A": "header=Authorization%3A{k}",
    "after %22": "body=%7B%22k%22%3A%22{k}%22%7D",
    "after %0A": "text=line%0A{k}",
    # a URL encoded again (a redirect target in a query parameter): the escape's own ``%`` became ``%25``
    "after %252F": "GET /login?next=%252Fapi%252F{k}",
    "after %253D": "state=token%253D{k}",
    "after %25252F": "u=%25252Fx%25252F{k}",
}

# must come through unchanged (decoded), wherever they stand
NEAR_MISSES = [
    "task-id",
    "task-abcdefghijklmnopqrstuvwxyz0123",
    "msg_01Kxoxb-98765432109876",
    "toolu_01xoxp-ABCDEFGHIJKL",
    "3f786850e387550fdab836ed7e6dc881de23001b",
    "disk-usage",
    "ASIAN food",
    "pwd: str",
    "password: x",
    "output_tokens",
    "eyJ alone",
    "AKIA short",
    "sk-short",
    "\ntask-sk-abcdefghijklmnopqrstuvwx",
    "\npassword: short",
    "\tnot_a_key",
    "\u2192AKIA1234",
    # hidden characters and entities that hide no key stay as they are
    "family \U0001f468\u200d\U0001f469\u200d\U0001f467",
    "it&#39;s &#65;&#66;",
    "hy\u00adphen\u200bated",
]


def _session(tmp: Path, raw_utf8: bool) -> None:
    """One session (main file + a 2.1.x subagent file) with every kind at every position."""
    sid = "c0ffee00-0000-4000-8000-00000000000%d" % (1 + raw_utf8)
    proj = tmp / "corpus"
    s = Session(sid=sid)
    s.user("start: " + " | ".join(NEAR_MISSES))
    for i, (kind, key, _) in enumerate(SAMPLES):
        for pos, tmpl in POSITIONS.items():
            s.user(tmpl.format(k=key))
        nested = json.dumps({"env": {"TOKEN": key}, "note": "line\n" + key, "cmd": "\t" + key})
        tid = f"tu_{i}_{kind}"
        s.assistant(
            thinking(f"the user pasted\n{key}\ninto the chat"),
            text(f"I will write the config.\n{key}"),
            tool("Write", tid, file_path="/tmp/cfg.json", content=nested, deeper=json.dumps({"inner": nested})),
        )
        s.result(tid, f"$ cat .env\nA=1\n{key}\nB=2\n", tur={"stdout": f"A=1\n{key}", "stderr": f"\t{key}"})
    # a damaged line: the record is cut off after the key (a crash mid-write), before its uuid
    cut = json.dumps(
        {
            "parentUuid": s.last,
            "type": "user",
            "message": {"role": "user", "content": "pasted:\n" + "\n".join(k for _, k, _ in SAMPLES) + "\nend"},
            "uuid": "x",
        }
    )
    s.raw(cut[: cut.index("\\nend")])
    s.assistant(text("done " + " ".join(NEAR_MISSES)))
    agent = Session(sid=sid, agent_id="a5ec0e7", sidechain=True)
    agent.user("Investigate the config")
    for i, (kind, key, _) in enumerate(SAMPLES):
        agent.user(f"found:\n{key}")
        agent.assistant(text(f"\t{key}"), tool("Bash", f"ag_{i}_{kind}", command=f"echo '{key}'"))
        agent.result(f"ag_{i}_{kind}", f"{key}\n", tur={"stdout": key})
    for sess, path in ((s, proj / f"{sid}.jsonl"), (agent, proj / sid / "subagents" / "agent-a5ec0e7.jsonl")):
        # as Claude Code writes: non-ASCII as UTF-8, not \\u escapes
        if raw_utf8:
            sess.lines = [
                line if not line.startswith("{") or not line.endswith("}") else orjson.dumps(json.loads(line)).decode()
                for line in sess.lines
            ]
        sess.write(path)


def _strings(v, out: list[str]) -> None:
    """Every string in a value, decoding strings that are themselves JSON (at any depth)."""
    if isinstance(v, str):
        out.append(v)
        t = v.strip()
        if t[:1] in '{["':
            try:
                _strings(json.loads(t), out)
            except ValueError:
                pass
    elif isinstance(v, dict):
        for k, x in v.items():
            _strings(k, out)
            _strings(x, out)
    elif isinstance(v, list):
        for x in v:
            _strings(x, out)


def _leaks(strings: list[str]) -> list[str]:
    """Fragments of planted keys, and anything the scrubber still matches, in the decoded strings."""
    bad = [f"{frag!r} in {s[:120]!r}" for s in strings for frag in FRAGMENTS if frag in s]
    scrubber = Scrubber()
    for s in strings:
        scrubber.scrub(s)
    return bad + [f"pattern {k} still matches {n}x" for k, n in scrubber.counts.items() if n]


ENGINES = ["python", "native"] if native.AVAILABLE else ["python"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("secret-corpus")
    _session(root, raw_utf8=False)
    _session(root, raw_utf8=True)
    return root


@pytest.fixture(scope="module", params=ENGINES)
def ingested(request, corpus, tmp_path_factory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp(f"corpus-{request.param}")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["ingest", str(corpus), "--out", str(out), "--engine", request.param]) == 0
    lines = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert lines[-1]["engine"] == request.param and lines[-1]["python_fallback_sessions"] == 0
    return out, lines


def test_every_kind_at_every_position_is_counted_and_the_engines_agree(corpus):
    results = [ingest_checked(sf) for sf in discover_sessions(corpus)]  # both engines, identical tables
    assert len(results) == 2 and all(len(r.file_reports) == 2 for r in results)
    for r in results:
        assert set(r.secrets) == set(KINDS)
        # main: positions + thinking + text + 3 in the nested input (x2 depths) + result + 2 tur; the
        # damaged line; the subagent: prompt, text, command, result, tur
        # every placement counted once, nothing else
        per_kind = len(POSITIONS) + 2 + 6 + 3 + 1 + 5
        assert r.secrets == {k: per_kind * PER_KIND[k] for k in KINDS}, r.secrets
        assert r.quarantine.num_rows == 1 and r.quarantine.column("salvaged_uuid")[0].as_py() is None


def test_no_key_in_any_output_table(ingested):
    out, lines = ingested
    assert {k for k, n in lines[-1]["secrets_scrubbed"].items() if n} == set(KINDS)
    files = sorted(out.glob("*.parquet"))
    assert {p.stem for p in files} == {"trace_states", "trace_messages", "quarantine"}
    strings: list[str] = []
    for p in files:
        t = pq.read_table(p)
        assert t.num_rows
        _strings(t.to_pylist(), strings)
    assert not _leaks(strings)
    quarantine = pq.read_table(out / "quarantine.parquet").column("text").to_pylist()
    assert len(quarantine) == 2 and all(q.count("[REDACTED:") == len(SAMPLES) for q in quarantine)
    decoded = "\n".join(strings)
    for near in NEAR_MISSES:
        assert near in decoded, f"near miss {near!r} was altered"


def test_no_key_in_the_prefix_show_prints(ingested):
    out, lines = ingested
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["show", "--all", "--json", "--store", str(out)]) == 0
    views = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert len(views) == lines[-1]["states"] == 2 * (len(SAMPLES) + 1) + 2 * len(SAMPLES)  # main + subagent states
    strings: list[str] = []
    _strings(views, strings)
    assert not _leaks(strings)
    prefix_text = "\n".join(s for v in views for m in v["prefix"] for s in _collect(m))
    assert prefix_text.count("[REDACTED:") > len(SAMPLES) * len(POSITIONS)
    assert "3f786850e387550fdab836ed7e6dc881de23001b" in prefix_text


def _collect(v) -> list[str]:
    got: list[str] = []
    _strings(v, got)
    return got


def test_the_prefix_is_scrubbed_again_as_sent(tmp_path):
    """Defense in depth: a key a writer spelled with a letter escape (``s\\u006b-...``; no JSON encoder
    Claude Code uses writes one) is invisible to the raw-line scrub, but the rendered prefix is
    scrubbed again as the JSON it is sent as, so neither a teacher nor ``show`` sees it."""
    from composer_pipeline.render import Conversation, RenderOptions, render_state

    key = KEYS["openai_key"][0]
    s = Session(sid="c0ffee00-0000-4000-8000-0000000000e5")
    s.user("PLACEHOLDER")
    s.assistant(text("ok"))
    s.lines[0] = s.lines[0].replace("PLACEHOLDER", "key:\\n s\\u006b" + key[2:])
    s.write(tmp_path / "p" / "s.jsonl")
    (sf,) = discover_sessions(tmp_path)
    res = ingest_checked(sf)
    assert not res.secrets  # the raw line shows no key
    (state,) = res.states.to_pylist()
    rendered = render_state(Conversation.from_table(res.messages), state, RenderOptions())
    sent = json.dumps(rendered.messages)
    assert key not in sent and "[REDACTED:openai_key]" in sent
    assert rendered.messages[1]["content"].startswith("key:\n [REDACTED:openai_key]")


def test_a_secret_in_a_session_id_reaches_no_key_or_path(tmp_path):
    """Discovery reads ``sessionId`` from the raw file (before scrubbing) to key agent files whose parent
    is missing; an id holding a key is not used: the agent file names its session."""
    key = KEYS["github_token"][0]
    a = Session(sid="\t" + key, agent_id="a0", sidechain=True)
    a.user("explore")
    a.assistant(text("ok"))
    a.write(tmp_path / "p" / "agent-a0.jsonl")
    (sf,) = discover_sessions(tmp_path)
    assert sf.key == "p__agent-a0"
    res = ingest_checked(sf)
    stored = str([res.states.to_pylist(), res.messages.to_pylist(), res.file_reports])
    assert key not in stored and "[REDACTED:github_token]" in stored


# Claude Code names a project folder after its cwd ("/" -> "-"): a key in the cwd is in the folder name
CWD_KINDS = ["aws_access_key", "anthropic_key", "openai_key", "github_token", "google_api_key", "slack_token"]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_key_in_the_project_folder_reaches_no_column_partition_key_or_path(tmp_path, engine):
    """The folder name becomes the session key, ``source_file``, ``stream_id`` and the partition key
    (the Dagster store path, run tags, UI): each is cleaned; two folders that differ only in their key
    keep distinct keys."""
    from upath import UPath

    from composer_pipeline.ingest.partition_keys import KeyMap
    from resources.storage import ParquetUPathIOManager

    root, sid = tmp_path / "traces", "c0ffee00-0000-4000-8000-000000000777"
    folders = [f"-home-dev-{KEYS[kind][0]}" for kind in CWD_KINDS]
    folders.append("-home-dev-" + KEYS["aws_access_key"][0].replace("QWERTY", "ZXCVBN"))  # same session file name
    # after a twice URL-encoded separator (a cwd named after a redirect URL)
    twice = {"AKIADBLENC0DED9KEY42": "DBLENC0DED9KEY42", "ghp_" + "Tw1cE3nc0dEd" * 3: "Tw1cE3nc0dEdTw1cE3"}
    folders += ["-home-dev-next=%252Fapi%252FAKIADBLENC0DED9KEY42", "-home-dev-token%253Dghp_" + "Tw1cE3nc0dEd" * 3]
    for folder in folders:
        cwd = "/" + folder[1:].replace("-", "/", 2)
        s = Session(sid=sid, cwd=cwd)
        s.user("hello")
        s.assistant(text("ok"), tool("Bash", "t1", command="ls"))
        s.result("t1", "a b")
        s.write(root / folder / f"{sid}.jsonl")
        agent = Session(sid=sid, agent_id="a5ec0e7", sidechain=True, cwd=cwd)
        agent.user("look")
        agent.assistant(text("done"))
        agent.write(root / folder / sid / "subagents" / "agent-a5ec0e7.jsonl")
    frags = [KEYS[kind][1] for kind in CWD_KINDS] + ["ZXCVBNUIOPASDFGH", *twice.values()]

    out = tmp_path / "out"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["ingest", str(root), "--out", str(out), "--engine", engine]) == 0
    lines = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert lines[-1]["sessions"] == len(folders) and lines[-1]["python_fallback_sessions"] == 0
    strings: list[str] = [buf.getvalue()]
    for p in sorted(out.glob("*.parquet")):
        _strings(pq.read_table(p).to_pylist(), strings)
    states = pq.read_table(out / "trace_states.parquet")
    session_keys = set(states.column("session_key").to_pylist())
    assert len(session_keys) == len(folders)  # distinct after cleaning
    assert all("[REDACTED:" in k for k in session_keys)
    streams = set(pq.read_table(out / "trace_messages.parquet").column("stream_id").to_pylist())
    assert len(streams) == 2 * len(folders) and all("[REDACTED:" in s for s in streams)  # main + agent streams

    keys = KeyMap(session_keys).assign()
    assert len(set(keys.values())) == len(folders)
    io_manager = ParquetUPathIOManager(base_path=UPath(str(tmp_path / "store")))
    paths = [
        str(io_manager.make_safe_partition_path(UPath(str(tmp_path / "store" / "trace_states")), pk))
        for pk in keys.values()
    ]
    strings += list(keys.values()) + paths
    bad = [f"{f!r} in {s[:160]!r}" for s in strings for f in frags if f in s]
    assert not bad, bad[:5]


def test_a_key_split_across_two_blocks_or_two_arguments_reaches_no_prefix(tmp_path):
    """Claude Code writes each block of a message as its own line, and ingest scrubs line by line: a key
    split across two text blocks, two thinking blocks, two user text blocks or two string arguments
    of a tool call matched nowhere, and the rendered prefix put its halves side by side. Each half
    alone matches no pattern (checked); the prefix holds neither (a PEM block is not split here: its
    BEGIN half is redacted alone)."""
    from composer_pipeline.render import Conversation, RenderOptions, render_state

    s = Session(sid="c0ffee00-0000-4000-8000-0000000000f9")
    halves = []
    for i, (kind, key, frag) in enumerate(SAMPLES):
        # (a hidden spelling cut in two: not handled)
        if kind == "private_key" or (kind, key, frag) in HIDDEN:
            continue
        # the cut nearest the middle where neither half matches alone
        probe = Scrubber()
        cut = min(
            (c for c in range(4, len(key) - 3) if probe.scrub(key[:c]) == key[:c] and probe.scrub(key[c:]) == key[c:]),
            key=lambda c: abs(c - len(key) // 2),
        )
        h1, h2 = key[:cut], key[cut:]
        # what must not be sent: the key's characters, not a name=/separator a redaction keeps
        value = next((m.end(1) for p in probe.patterns if p.kind == kind and p.keep for m in [p.rs.search(key)]), 0)
        halves += [x for x in (key[value:cut], key[max(cut, value) :]) if len(x) >= 4]
        s.user([text("the token is " + h1), text(h2 + " please use it")])
        s.assistant(
            thinking("they pasted " + h1),
            thinking(h2),
            text("I will set " + h1),
            text(h2 + " now"),
            tool("Bash", f"t{i}", command="export TOKEN=" + h1, description=h2),
        )
        s.result(f"t{i}", "ok")
    s.user("thanks")
    s.assistant(text("done"))
    s.write(tmp_path / "p" / "s.jsonl")
    (sf,) = discover_sessions(tmp_path)
    res = ingest_checked(sf)
    conv = Conversation.from_table(res.messages)
    states = res.states.to_pylist()
    sent = json.dumps([render_state(conv, st, RenderOptions()).messages for st in states])
    leaked = [h for h in halves if h in sent]
    assert not leaked, leaked
    assert not _leaks([sent])
    last = render_state(conv, states[-1], RenderOptions()).messages
    assert sum(json.dumps(m).count("[REDACTED:") for m in last) >= 4 * (len(SAMPLES) - 1)


def test_both_prefilter_backends_and_the_exact_path_agree_on_the_corpus(corpus):
    """The corpus files (every kind at every position, percent-escapes included) scrub the same through
    the Hyperscan prefilter (where installed), the RE2 fallback and the exact patterns alone."""
    files = sorted(corpus.rglob("*.jsonl"))
    assert len(files) == 4
    for path in files:
        data = path.read_bytes()
        exact = Scrubber()
        want = exact._scrub_lines(data)
        for backend in ("auto", "re2"):
            s = Scrubber()
            assert s.scrub_bytes(data, backend) == want, (path, backend)
            assert dict(s.counts) == dict(exact.counts), (path, backend)


def test_a_key_whose_first_half_matches_alone_leaves_no_second_half_in_the_prefix(tmp_path):
    """A 108-character Anthropic key split across two user text blocks after 56 characters: the first
    half is a key by itself and was redacted at ingest, so the seam showed a tag and the 52 characters
    after it, which match nothing, and they reached the teacher. A tag that ends a block now takes the
    key's rest at the start of the next one (text, thinking and tool-call arguments alike)."""
    from composer_pipeline.render import Conversation, RenderOptions, render_state

    keys = {"anthropic_key": "sk-ant-api03-" + ("Lo9Ng8An7Th6Ro5Pi4Ck3" * 5)[:95]}
    keys["github_token"] = "ghp_" + "Se4Co1Nd7Ha2Lf" * 5
    keys["openai_key"] = "sk-proj-" + "Op5Li9Tt3Wo8Bl" * 6
    s = Session(sid="c0ffee00-0000-4000-8000-0000000000fa")
    rests = []
    for i, (kind, key) in enumerate(keys.items()):
        cut = len(key) * 52 // 100
        head, rest = key[:cut], key[cut:]
        assert Scrubber().scrub(head) == f"[REDACTED:{kind}]" and Scrubber().scrub(rest) == rest
        rests.append(rest)
        s.user([text("my key is " + head), text(rest + " - please use it")])
        s.assistant(text("I will set " + head), text(rest), tool("Bash", f"t{i}", command="export K=" + head, d=rest))
        s.result(f"t{i}", "ok")
    s.user("thanks")
    s.assistant(text("done"))
    s.write(tmp_path / "p" / "s.jsonl")
    (sf,) = discover_sessions(tmp_path)
    res = ingest_checked(sf)
    conv = Conversation.from_table(res.messages)
    last = res.states.to_pylist()[-1]
    sent = json.dumps(render_state(conv, last, RenderOptions()).messages)
    assert len(keys["anthropic_key"]) == 108
    leaked = [r[:12] for r in rests if r[:12] in sent]
    assert not leaked, leaked
    assert sent.count("- please use it") == len(keys)  # the next block's own words stay
