"""Secret scrubbing: API keys, tokens, private keys and ``password=``-style values -> ``[REDACTED:<kind>]``.

In:  text (``str``) or a whole file buffer (``bytes``, the ingest hot path).
Out: the same text with every secret replaced, plus per-kind counts in ``Scrubber.counts``.

Scrubbing runs on the raw JSONL bytes *before* parsing, so every derived column (content, raw line,
quarantine text) is already clean. Replacements contain no quote or backslash, so a JSON line stays
valid. Each built-in kind has cheap literal substrings that must occur for the regex to be able to
match (a ``bytes.__contains__`` precheck over the whole buffer); the regex runs only when one does.
Extra patterns from ``recipes/ingest.yaml`` (``extra_secret_patterns: {kind: regex}``) always run.

Deliberately simplified: patterns follow the published token formats (gitleaks-style prefixes:
AKIA/ASIA, ghp_/github_pat_, sk-/sk-ant-, xox?-, AIza, eyJ...JWT, PEM blocks); a key without a
recognisable prefix is only caught when it is assigned to a secret-sounding name.
"""

from __future__ import annotations

import re
from collections import Counter

# kind -> (regex source, literal prechecks). Order matters: anthropic before openai (both "sk-").
_BUILTIN: list[tuple[str, str, tuple[str, ...]]] = [
    (
        "private_key",
        r"(?s)-----BEGIN [A-Z ]{0,20}PRIVATE KEY-----(?:.*?-----END [A-Z ]{0,20}PRIVATE KEY-----|[A-Za-z0-9+/=\\\s]*)",
        ("PRIVATE KEY-----",),
    ),  # in JSONL a key is one line (escaped newlines); in plain text it spans lines (DOTALL)
    ("aws_access_key", r"(?<![A-Z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Z0-9])", ("AKIA", "ASIA")),
    (
        "aws_secret_key",
        r"(?i)(?<=aws_secret_access_key)(?:\\?[\"'])?\s*[:=]\s*(?:\\?[\"'])?[A-Za-z0-9/+]{40}",
        ("aws_secret", "AWS_SECRET"),
    ),
    (
        "github_token",
        r"(?<![A-Za-z0-9_])(?:(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})",
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    ("anthropic_key", r"(?<![A-Za-z0-9_])sk-ant-[A-Za-z0-9_\-]{20,}", ("sk-ant-",)),
    ("openai_key", r"(?<![A-Za-z0-9_\-])sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}", ("sk-",)),
    (
        "slack_token",
        r"(?<![A-Za-z0-9])xox[abposr]-[A-Za-z0-9\-]{10,}|https://hooks\.slack\.com/services/[A-Za-z0-9/_\-]+",
        ("xox", "hooks.slack.com"),
    ),
    ("google_api_key", r"(?<![A-Za-z0-9])AIza[0-9A-Za-z_\-]{35}", ("AIza",)),
    ("jwt", r"(?<![A-Za-z0-9])eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}", ("eyJ",)),
]

# ``password = "..."``, ``DB_PASSWORD: ...``, ``"api_key": "..."`` (also inside JSON-escaped strings).
# Only the value is replaced; values shorter than 6 characters (``pwd: str``) are left alone.
_ASSIGN_NAMES = (
    r"password|passwd|pwd|secret|client[_\-]?secret|secret[_\-]?key|api[_\-]?key|access[_\-]?token"
    r"|auth[_\-]?token|refresh[_\-]?token|private[_\-]?key"
)
_ASSIGN = (
    r"(?i)(?<![A-Za-z0-9])((?:" + _ASSIGN_NAMES + r")(?:\\?[\"'])?[ \t]*[:=][ \t]*(?:\\?[\"'])?)"
    r"(?!\[REDACTED)([^\s\"'\\,;&<>(){}\[\]`]{6,})"
)
# matched against the lower-cased text: every name above contains one of these
_ASSIGN_PRECHECK = (
    "password", "passwd", "pwd", "secret", "api_key", "api-key", "apikey", "access_token", "access-token",
    "accesstoken", "auth_token", "auth-token", "authtoken", "refresh_token", "refresh-token", "refreshtoken",
    "private_key", "private-key", "privatekey",
)

KINDS = [k for k, _, _ in _BUILTIN] + ["password_assignment"]


class _Pattern:
    """One secret kind. ``pre_*``: literals every match contains (lower-case ones for ``assign``)."""

    __slots__ = ("kind", "rs", "rb", "pre_s", "pre_b", "assign")

    def __init__(self, kind: str, source: str, prechecks: tuple[str, ...], assign: bool = False):
        self.kind = kind
        self.rs = re.compile(source)
        self.rb = re.compile(source.encode())
        self.pre_s = prechecks
        self.pre_b = tuple(p.encode() for p in prechecks)
        self.assign = assign


class Scrubber:
    """Replace secrets; ``counts`` accumulates per-kind replacements over every call."""

    def __init__(self, extra_patterns: dict[str, str] | None = None):
        self.patterns = [_Pattern(k, s, pre) for k, s, pre in _BUILTIN]
        self.patterns.append(_Pattern("password_assignment", _ASSIGN, _ASSIGN_PRECHECK, assign=True))
        for kind, source in (extra_patterns or {}).items():
            try:
                self.patterns.append(_Pattern(str(kind), source, ()))
            except re.error as e:
                raise ValueError(f"extra_secret_patterns[{kind!r}] is not a valid regex: {e}") from None
        self.counts: Counter[str] = Counter()

    def scrub(self, text: str) -> str:
        for p in self.patterns:
            hay = text.lower() if p.assign else text
            if p.pre_s and not any(s in hay for s in p.pre_s):
                continue
            repl = (lambda m, k=p.kind: m.group(1) + f"[REDACTED:{k}]") if p.assign else f"[REDACTED:{p.kind}]"
            text, n = p.rs.subn(repl, text)
            if n:
                self.counts[p.kind] += n
        return text

    def scrub_bytes(self, data: bytes) -> bytes:
        """The ingest hot path over a whole file buffer.

        For each kind, ``bytes.find`` locates its literals; the regex then runs only on the lines
        holding a hit (no pattern can match across a newline and every match contains a literal, so
        this equals running it on the whole buffer). Extra patterns (no literals) run on everything.
        """
        for p in self.patterns:
            tag = f"[REDACTED:{p.kind}]".encode()
            repl = (lambda m, t=tag: m.group(1) + t) if p.assign else tag
            if not p.pre_b:
                data, n = p.rb.subn(repl, data)
                if n:
                    self.counts[p.kind] += n
                continue
            hay = data.lower() if p.assign else data
            spans: set[tuple[int, int]] = set()
            for lit in p.pre_b:
                i = hay.find(lit)
                while i != -1:
                    start = data.rfind(b"\n", 0, i) + 1
                    end = data.find(b"\n", i)
                    end = len(data) if end == -1 else end
                    spans.add((start, end))
                    i = hay.find(lit, end)
            if not spans:
                continue
            pieces, pos, total = [], 0, 0
            for start, end in sorted(spans):
                new, n = p.rb.subn(repl, data[start:end])
                if n:
                    pieces.append(data[pos:start])
                    pieces.append(new)
                    pos = end
                    total += n
            if total:
                pieces.append(data[pos:])
                data = b"".join(pieces)
                self.counts[p.kind] += total
        return data


def scan(text: str, extra_patterns: dict[str, str] | None = None) -> dict[str, int]:
    """Count secrets in ``text`` per kind without keeping the scrubbed text (asset checks)."""
    s = Scrubber(extra_patterns)
    s.scrub(text)
    return dict(s.counts)
