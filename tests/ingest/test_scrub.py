"""Secret scrubbing: every kind, the fast bytes path equals the plain regex path, nothing leaks."""

from __future__ import annotations

import json
import platform
import random
import time

import orjson
import pytest

from composer_pipeline.ingest.config import IngestRecipe
from composer_pipeline.ingest.discover import discover_sessions
from composer_pipeline.scrub import KINDS, Scrubber, scan
from tests.support.sessions import Session, text, tool

from .engines import ingest_checked

# fake secrets in each published format (none of them is real)
SECRETS = {
    "aws_access_key": "AKIAIOSFODNN7EXAMPLE",
    "aws_secret_key": "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "github_token": "ghp_" + "A1b2C3d4" * 5,
    "anthropic_key": "sk-ant-api03-" + "x9Y8z7W6" * 5,
    "openai_key": "sk-proj-" + "Q1w2E3r4" * 5,
    "slack_token": "xoxb-2470385-98765432101-AbCdEfGhIjKlMnOp",
    "google_api_key": "AIza" + "SyD4e5F6g7H8i9J0k1L2m3N4o5P6q7R8s9T",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlLXNpZ25hdHVyZQ",
    "private_key": "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA1234\nabcd==\n-----END RSA PRIVATE KEY-----",
    "password_assignment": 'DB_PASSWORD="hunter2hunter2"',
}
SECRET_VALUES = [
    "AKIAIOSFODNN7EXAMPLE",
    "wJalrXUtnFEMI/K7MDENG",
    "A1b2C3d4A1b2",
    "x9Y8z7W6x9Y8",
    "Q1w2E3r4Q1w2",
    "98765432101-AbCd",
    "SyD4e5F6g7H8",
    "eyJzdWIiOiIxMjM0NTY3ODkwIn0",
    "MIIEowIBAAKCAQEA1234",
    "hunter2hunter2",
]


@pytest.mark.parametrize("kind", sorted(SECRETS))
def test_each_kind_scrubbed_and_counted(kind):
    assert kind in KINDS
    s = Scrubber()
    out = s.scrub(f"before {SECRETS[kind]} after")
    assert f"[REDACTED:{kind}]" in out and s.counts[kind] == 1
    assert not any(v in out for v in SECRET_VALUES)
    assert out.startswith("before ") and out.endswith(" after")


def test_fine_grained_github_token_scrubbed_at_every_boundary():
    """``github_pat_...`` (fine-grained personal access tokens) as well as ``ghp_...``: a pattern that
    spelled the prefix ``gh`` + ``ithub_pat_`` never matched one."""
    pat = "github_pat_11ABCDEFG0" + "x9Y8z7W6v5" * 6
    for text_ in (pat, f"token: {pat}", f"x\n{pat}", f"GH_TOKEN={pat} rest"):
        for data in (text_, json.dumps({"c": text_}), json.dumps({"c": json.dumps({"in": text_})})):
            s = Scrubber()
            assert "x9Y8z7W6v5" not in s.scrub(data) and s.counts == {"github_token": 1}
            fast = Scrubber()
            assert b"x9Y8z7W6v5" not in fast.scrub_bytes(data.encode()) and fast.counts == {"github_token": 1}
    assert Scrubber().scrub("agithub_pat_" + "n" * 30) == "agithub_pat_" + "n" * 30  # inside a word: not a token


def test_near_misses_untouched():
    benign = (
        "task-abcdefghijklmnopqrstuvwxyz0123 disk-usage ASIAN food pwd: str password: x "
        "output_tokens input_tokens eyJ alone AKIA short sk-short"
    )
    s = Scrubber()
    assert s.scrub(benign) == benign and not s.counts


def test_bytes_fast_path_equals_regex_on_json_lines():
    """The literal-precheck + per-line path must give exactly what the plain regexes give."""
    rng = random.Random(7)
    filler = ["hello world", "task-runner", "output_tokens", "Passwords are hard", "the SECRET sauce", "api", "x" * 50]
    lines = []
    for i in range(400):
        parts = [rng.choice(filler) for _ in range(rng.randint(1, 5))]
        if rng.random() < 0.3:
            parts.insert(
                rng.randint(0, len(parts)), rng.choice(["", "\n", "\t", "\u00e9"]) + rng.choice(list(SECRETS.values()))
            )
        # half the lines escape non-ASCII (json.dumps), half keep UTF-8 (orjson): both boundary forms
        dump = orjson.dumps if i % 2 else (lambda o: json.dumps(o).encode())
        lines.append(dump({"i": i, "message": {"content": " ".join(parts)}, "tur": {"k": json.dumps(" ".join(parts))}}))
    data = b"\n".join(lines) + b"\n"
    fast = Scrubber()
    out = fast.scrub_bytes(data)
    slow = Scrubber()
    expected = data
    # reference: every regex over the whole buffer, no prechecks
    for p in slow.patterns:
        tag = f"[REDACTED:{p.kind}]".encode()
        expected, n = p.rb.subn((lambda m, t=tag: m.group(1) + t) if p.keep else tag, expected)
        slow.counts[p.kind] += n
    assert out == expected and fast.counts == +slow.counts and sum(fast.counts.values()) > 50
    for line in out.split(b"\n")[:-1]:
        orjson.loads(line)  # still valid JSON
    assert not any(v.encode() in out for v in SECRET_VALUES)


def test_a_redaction_keeps_every_line_valid_json_at_any_nesting_depth():
    """Only the key (or the value of a name = value pair) is replaced: quotes and backslashes around it
    stay, so a line stays valid JSON and a JSON document nested in it (at any depth) stays one too."""
    for kind, secret in SECRETS.items():
        for inner in (
            {"k": "\n" + secret + "\t"},
            {"k": SECRETS["private_key"].split("-----END")[0]},
            {"aws_secret_access_key": "w" * 40},
            {"password\\": "hunter22"},
            {"api_key": secret},
        ):
            for depth in range(3):
                doc = inner
                for _ in range(depth + 1):
                    doc = json.dumps(doc)
                line = json.dumps({"c": doc}).encode()
                s = Scrubber()
                out = s.scrub_bytes(line)
                assert s.counts, (kind, depth, line)
                got = json.loads(out)["c"]
                for _ in range(depth + 1):
                    got = json.loads(got)  # each level still decodes
                assert not any(v in json.dumps(got) for v in SECRET_VALUES), (kind, depth, got)


def test_extra_patterns_and_scan():
    s = Scrubber({"ticket": r"TKT-[0-9a-f]{8}"})
    assert s.scrub("see TKT-deadbeef") == "see [REDACTED:ticket]" and s.counts["ticket"] == 1
    assert scan(f"{SECRETS['jwt']} and {SECRETS['aws_access_key']}") == {"jwt": 1, "aws_access_key": 1}
    with pytest.raises(ValueError, match="not a valid regex"):
        Scrubber({"bad": "("})


def test_no_secret_reaches_any_table(tmp_path):
    s = Session()
    s.user(f"use {SECRETS['anthropic_key']} and {SECRETS['password_assignment']}")
    s.assistant(
        text(f"export GITHUB_TOKEN={SECRETS['github_token']}"),
        tool("Bash", "t1", command=f"curl -H 'x-api-key: {SECRETS['openai_key']}'"),
    )
    s.result("t1", SECRETS["private_key"], tur={"stdout": SECRETS["aws_access_key"], "stderr": SECRETS["jwt"]})
    s.raw('{"uuid":"00000000-0000-4000-8000-0000000000ff","broken": "%s' % SECRETS["slack_token"])  # damaged line
    s.user("ticket TKT-0123456789abcdef0123456789abcdef")
    s.assistant(text("ok"))
    s.write(tmp_path / "p" / "s.jsonl")
    # has an extra pattern: internal_ticket_token
    recipe = IngestRecipe.load("recipes/ingest.yaml")
    (sf,) = discover_sessions(tmp_path)
    res = ingest_checked(sf, recipe)
    dump = json.dumps([res.states.to_pylist(), res.messages.to_pylist(), res.quarantine.to_pylist()])
    assert not any(v in dump for v in SECRET_VALUES) and "TKT-0123" not in dump
    assert res.secrets["internal_ticket_token"] == 1 and res.secrets["slack_token"] == 1
    assert res.quarantine.num_rows == 1 and "[REDACTED:slack_token]" in res.quarantine.column("text")[0].as_py()
    assert set(res.secrets) >= {"anthropic_key", "github_token", "openai_key", "private_key", "aws_access_key", "jwt"}


def test_hyperscan_prefilter_present_where_declared():
    """pyproject declares hyperscan for x86-64; elsewhere the RE2 fallback is used."""
    import platform

    from composer_pipeline.scrub import _hyperscan_db

    assert bool(_hyperscan_db()) == (platform.machine() in ("x86_64", "AMD64"))


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="Hyperscan is declared for x86-64 only")
def test_hyperscan_database_cache_round_trip(tmp_path, monkeypatch):
    """The compiled prefilter is cached on disk; a fresh process loads it instead of compiling, and a
    damaged or foreign cache file is ignored and rewritten. Every path finds the same candidate lines."""
    import hyperscan

    from composer_pipeline import scrub

    monkeypatch.setenv("COMPOSER_PIPELINE_HOME", str(tmp_path))
    data = b"\n".join(
        orjson.dumps({"c": c}) for c in (*SECRETS.values(), "task-sk-" + "a" * 30, "plain", "\n" + SECRETS["jwt"])
    )
    path = scrub._hyperscan_cache_path()
    assert path.is_relative_to(tmp_path) and not path.exists()
    monkeypatch.setattr(scrub, "_HS_DB", None)
    want = scrub._candidate_lines(data)  # compiled, then written
    # every line but "plain" (task-sk- is a candidate)
    assert len(want) == len(SECRETS) + 2 and path.is_file()
    cached = scrub._hyperscan_cached(hyperscan)
    assert cached is not None
    monkeypatch.setattr(scrub, "_HS_DB", cached)
    assert scrub._candidate_lines(data) == want
    for damage in (path.read_bytes()[:-7], b"\0" * 32 + b"not a database", b""):
        path.write_bytes(damage)
        assert scrub._hyperscan_cached(hyperscan) is None
        monkeypatch.setattr(scrub, "_HS_DB", None)
        assert scrub._candidate_lines(data) == want  # compiled again, and the cache repaired
        assert scrub._hyperscan_cached(hyperscan) is not None


@pytest.mark.parametrize("backend", ["auto", "re2"])  # auto = Hyperscan where installed
def test_prefilter_path_equals_exact_path_on_messy_buffers(backend):
    """scrub_bytes (prefilter, exact patterns only on candidate lines, and with Hyperscan only the kinds
    whose prefilter parts matched there) == the exact path over the whole buffer, on lines mixing
    secrets, near misses, mixed case, non-ASCII and invalid UTF-8. Both prefilter backends: Hyperscan
    (auto, where installed) and the RE2 fallback."""
    rng = random.Random(11)
    pieces = list(SECRETS.values()) + [
        "PassWord: 'Tr0ub4dor&3'",
        "API-KEY=abcdefgh",
        'api_key\\": \\"zzzzzzzz',
        "Client_Secret = qwertyuiop",
        "SECRET\t:\tvalue1234",
        "pwd=short",
        "AKIAIOSFODNN7EXAMPL",
        "xoxp-1",
        "sk-ant-short",
        "ghs_" + "z" * 36,
        "ſecret: 12345678",
        "paſsword=abcdefgh",
        "Kelvin\u212a",
        "ünïcödé text",
        "eyJonly.eyJtwo",
        "task-sk-" + "a" * 30,
        # each kind at its length threshold and one short of it (the prefilter cuts ``{n,}`` to ``{n}``)
        "sk-" + "b" * 20,
        "sk-" + "b" * 19,
        "sk-ant-" + "c" * 20,
        "sk-proj-" + "d" * 19,
        "xoxb-" + "1" * 10,
        "xoxb-" + "1" * 9,
        "AKIA" + "Z" * 16,
        "ASIA" + "Z" * 15,
        "AIza" + "k" * 35,
        "AIza" + "k" * 34,
        "gho_" + "m" * 30,
        "ghr_" + "m" * 29,
        "github_pat_" + "n" * 22,
        "github_pat_" + "n" * 21,
        "eyJ" + "p" * 8 + ".eyJ" + "q" * 8 + "." + "r" * 8,
        "eyJ" + "p" * 8 + ".eyJ" + "q" * 8 + "." + "r" * 7,
        "passwd:abcdef",
        "passwd:abcde",
        'secret_key \\"= 123456',
        "https://hooks.slack.com/services/T0/B1/xyz",
        "hooks.slack.com/services/",
        "AWS_SECRET_ACCESS_KEY: " + "w" * 40,
        # behind the escapes a decoded line start, tab, CR or non-ASCII character becomes; nested JSON
        "\n" + SECRETS["jwt"],
        "\t" + SECRETS["github_token"],
        "\r" + SECRETS["aws_access_key"],
        "\u00e9" + SECRETS["openai_key"],
        json.dumps({"in": "\n" + SECRETS["slack_token"]}),
        json.dumps(json.dumps({"pwd": "\tletmein99"})),
        "password\t:\tabcdefgh",
        "\nAKIA" + "Q" * 15,
        "\ntask-sk-" + "a" * 30,
        "\n" + SECRETS["password_assignment"],
    ]
    lines = []
    for i in range(600):
        parts = [rng.choice(pieces) if rng.random() < 0.4 else "filler words here" for _ in range(rng.randint(1, 6))]
        # every third line glues its pieces together: a key right behind another kind's key (or its tag,
        # once replaced), where only the kinds the prefilter named for the line may run
        c = ("" if i % 3 == 0 else " ").join(parts)
        line = orjson.dumps({"i": i, "c": c}) if i % 2 else json.dumps({"i": i, "c": c}).encode()
        if rng.random() < 0.05:
            line = line[: rng.randint(1, len(line))] + b"\xff\xfe" + line[rng.randint(0, len(line)) :]
        lines.append(line)
    for data in (b"\n".join(lines), b"\n".join(lines) + b"\n", b"\n\n" + b"\r\n".join(lines[:50])):
        fast, exact = Scrubber(), Scrubber()
        assert fast.scrub_bytes(data, backend) == exact._scrub_lines(data)
        assert fast.counts == exact.counts and sum(fast.counts.values()) > 10
        # same order of kinds (the CLI prints them)
        assert list(fast.counts) == list(exact.counts)


def _best_of(runs: int, fn) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def test_private_key_headers_without_an_end_line_scrub_in_linear_time():
    """``grep -rn 'PRIVATE KEY' certs/`` prints BEGIN lines and no END line: the pattern once looked for
    an END from every header to the end of the text (433 KB took 23 s, and a teacher answer like it
    blocked a replay's event loop past its lease). A body now stops at the next ``-----BEGIN``: 8,000
    headers take well under a second, as text and as a JSONL line, and the time per header does not
    grow with their number (quadratic: 8x from 1,000 to 8,000 headers)."""

    def grep_output(n: int) -> str:
        return "".join(f"certs/k{i}.pem:1:-----BEGIN RSA PRIVATE KEY-----\n" for i in range(n))

    big, small = grep_output(8000), grep_output(1000)
    line = orjson.dumps({"type": "user", "message": {"content": big}})
    s = Scrubber()
    out = s.scrub(big)
    assert s.counts["private_key"] == out.count("[REDACTED:private_key]") == 8000 and "BEGIN" not in out
    assert _best_of(2, lambda: Scrubber().scrub(big)) < 1.0
    assert _best_of(2, lambda: Scrubber().scrub_bytes(line)) < 1.0
    per_header_big = _best_of(3, lambda: Scrubber().scrub(big)) / 8000
    per_header_small = _best_of(3, lambda: Scrubber().scrub(small)) / 1000
    assert per_header_big < 4 * per_header_small
    # a block whose END comes after other text still goes whole, headers and all
    pem = "-----BEGIN ENCRYPTED PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,AB12\n\nMIIE9x==\n"
    pem += "-----END ENCRYPTED PRIVATE KEY-----"
    assert Scrubber().scrub(f"a\n{pem}\nb -----BEGIN RSA PRIVATE KEY-----") == (
        "a\n[REDACTED:private_key]\nb [REDACTED:private_key]"
    )


class _Spy:
    """A built-in pattern that records its kind whenever its exact pattern is about to run."""

    def __init__(self, pattern, ran: list):
        self._p, self._ran = pattern, ran

    def __getattr__(self, name):
        # the regex, or the assignment pass's name lookups
        if name in ("rb", "pre"):
            self._ran.append(self._p.kind)
        return getattr(self._p, name)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="Hyperscan is declared for x86-64 only")
def test_a_hidden_spelling_runs_only_the_kinds_its_line_and_its_shown_line_name():
    """A line with a hidden spelling is scrubbed as written and as shown; with Hyperscan only the kinds
    whose prefilter parts match the line (and, shown, the shown line) run: a zero-width joiner inside an
    emoji (common in real sessions) ran every pattern twice. Same result as the exact path."""
    family = "family \U0001f468\u200d\U0001f469\u200d\U0001f467 and \U0001f575\ufe0f\u200d\u2640\ufe0f"
    # text: (the kinds whose exact patterns may run, the kinds found)
    cases = {
        family: ([], []),  # no key: no exact pattern runs at all
        family + " " + SECRETS["openai_key"]: (["anthropic_key", "openai_key"], ["openai_key"]),  # (one part)
        "ghp_" + "A1b2\u200bC3d4" * 5: (["github_token"], ["github_token"]),  # only the shown line names it
        "&#65;KIAENT1TYENC0DED9XY it&#39;s": (["aws_access_key"], ["aws_access_key"]),
    }
    for c, (kinds, found) in cases.items():
        data = orjson.dumps({"type": "user", "c": c})
        fast, exact = Scrubber(), Scrubber()
        ran: list[str] = []
        fast.builtin = [_Spy(p, ran) for p in fast.builtin]
        assert fast.scrub_bytes(data, "hyperscan") == exact._scrub_lines(data)
        assert fast.counts == exact.counts
        assert sorted(set(ran)) == kinds, c
        assert sorted(fast.counts) == found
