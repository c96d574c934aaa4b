"""Secret scrubbing: API keys, tokens, private keys and ``password=``-style values -> ``[REDACTED:<kind>]``.

In:  text (``str``) or a whole file buffer (``bytes``, the ingest hot path).
Out: the same text with every secret replaced, plus per-kind counts in ``Scrubber.counts``;
``Scrubber.scrub_seams`` for pieces shown side by side (a key split across two of them).

Scrubbing runs on the raw JSONL bytes *before* parsing, so every derived column (content, raw line,
quarantine text) is already clean. A secret is matched where a reader of the decoded text sees one:
the boundaries are escape-aware (a key right after ``\\n``, ``\\t``, ``\\uXXXX``, the doubled
escapes of a JSON document nested in a string, or a URL's percent-escape ``%20`` / ``%2F`` / ``%3D``,
also encoded again, ``%252F`` / ``%253D`` (up to three times), matches; see ``_start``). A
URL-encoded key itself: the built-in token formats consist of characters URL encoders leave alone
(letters, digits, ``-_.``: encodeURIComponent, ``urllib.parse.quote``), so an encoded key is the key
and is caught; a Slack webhook URL is also matched with ``%2F`` for ``/``, and ``password%3D...``
(``%3A`` / ``%3D`` / ``%22`` for ``:`` / ``=`` / a quote) counts as an assignment (its value up to
the next ``&``). Not caught: a key whose unreserved characters were escaped too
(``sk%2Dant%2D...``, which no standard encoder writes) and a PEM block whose blanks became ``%20``.
A key with an invisible character inside (zero-width space, soft hyphen, ...) or a letter written as
an HTML numeric entity (``&#65;KIA...``) is caught as a reader sees it (``_INVISIBLE``). Replacements
contain no quote or backslash and never take half an escape, so a JSON line, and any JSON nested in
it, stays valid. On a file buffer one prefilter pass (Hyperscan, else RE2 via ``pyarrow.compute``) finds the
lines that could hold a built-in secret and, with Hyperscan, which kinds; only those kinds' exact
regexes then run, line by line, on only those lines. Extra patterns from ``recipes/ingest.yaml``
(``extra_secret_patterns: {kind: regex}``) always run on the whole buffer.

Deliberately simplified: patterns follow the published token formats (gitleaks-style prefixes:
AKIA/ASIA, ghp_/github_pat_, sk-/sk-ant-, xox?-, AIza, eyJ...JWT, PEM blocks); a key without a
recognisable prefix is only caught when it is assigned to a secret-sounding name.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from pathlib import Path

import pyarrow as pa

from composer_pipeline.home import default_home

# Boundaries as a reader of the decoded text sees them. The patterns run on the raw JSONL bytes, where
# a key at a line start or after a tab stands right behind a JSON escape (``\n``, ``\t``, ``\u0009``;
# ``\\n`` in a JSON string nested in a JSON string): its last character is a letter or hex digit, so a
# plain ``(?<![A-Za-z0-9])`` would refuse the match. ``_start(cls)`` also accepts a position right after
# a backslash + an escape letter or ``\uXXXX`` (whatever the escape decodes to: erring on the side of
# redaction). An escape of an ASCII letter *inside* a key (``s\u006b-...``) is not decoded: no JSON
# encoder writes one (JSON.stringify, orjson and json.dumps escape only quotes, backslashes, control
# characters and, optionally, non-ASCII).
# A URL's percent-escape (``%20``, ``%2F``, ``%3D``, ``%0A``: a curl command, a logged URL) ends in a hex
# digit too, and decodes to a separator: a key right after one matches as well, also when the URL was
# encoded again (``%252F``: a URL in a query parameter, ``next=%252Fapi%252F...``), up to three times.
# what stands before the two hex digits of an escape encoded 1, 2, 3 times
_PERCENT = ("%", "%25", "%2525")
_ESCAPE_BEFORE = (  # case-sensitive even in (?i)
    r"(?-i:(?<=\\[nrtbf])|(?<=\\u[0-9A-Fa-f]{4})" + "".join(f"|(?<={p}[0-9A-Fa-f]{{2}})" for p in _PERCENT) + ")"
)
# a percent-escape in a pattern: encoded once or more (``%3D``, ``%253D``)
_PCT = "%(?:25)*"


def _start(cls: str) -> str:
    """A match start not preceded by a character of ``cls`` (a character class), or right after an escape."""
    return rf"(?:(?<!{cls})|{_ESCAPE_BEFORE})"


def _keyed(cls: str, lit: str) -> str:
    """``_start(cls) + lit``, written literal first: the same matches, but ``re`` can then find candidates
    with its fast literal-prefix search instead of trying the lookbehinds at every offset (``lit``: a
    literal, or an alternation of literals of one length)."""
    return rf"(?:{lit})" + _after(cls, lit)


def _after(cls: str, lit: str) -> str:
    """The boundary check of :func:`_keyed`, placed right after ``lit``."""
    return (
        rf"(?:(?<!{cls}(?:{lit}))|(?-i:(?<=\\[nrtbf](?:{lit}))|(?<=\\u[0-9A-Fa-f]{{4}}(?:{lit}))"
        + "".join(rf"|(?<={p}[0-9A-Fa-f]{{2}}(?:{lit}))" for p in _PERCENT)
        + "))"
    )


# Between a secret-sounding name and its value: a quote (escaped at any depth: ``\"``, ``\\\"``), blanks
# (a tab is ``\t`` in JSON), ``:`` or ``=``, blanks, a quote.
_QUOTE = r"""(?:\\*[\"']|""" + _PCT + "2[27])?"  # (%22 / %27: a URL-encoded quote)
_BLANKS = r"(?:[ \t]|\\t)*"
# (``%3A`` / ``%3D``: the ``:`` / ``=`` of a URL-encoded query string, ``?q=DB_PASSWORD%3Dhunter22``)
_SEP = _QUOTE + _BLANKS + "(?:[:=]|" + _PCT + "3[AaDd])" + _BLANKS + _QUOTE

# kind -> (regex source, prechecks). Every match of the regex contains a match of one precheck
# (literals, or regexes that start with a literal so ``re`` can use its fast prefix search).
# Prechecks in lower case run on the lower-cased buffer. Order matters: anthropic before openai.
_BUILTIN: list[tuple[str, str, tuple[str, ...]]] = [
    (
        "private_key",
        r"(?s)-----BEGIN [A-Z ]{0,20}PRIVATE KEY-----(?:(?:(?!-----BEGIN ).)*?-----END [A-Z ]{0,20}PRIVATE KEY-----"
        r"|(?:[A-Za-z0-9+/=\s]|\\+[nrt])*)",
        ("PRIVATE KEY-----",),
        # in JSONL a key is one line (escaped newlines); in plain text it spans lines (DOTALL). The END
    ),
    # line is looked for only up to the next "-----BEGIN " (a block holds none): linear in the text
    # however many headers lack an END (grep output of certs/ has thousands). Without its END line
    # (cut off) the body runs on while it is base64, blanks or newline escapes at any nesting depth
    # (a run of backslashes + n/r/t), never into the backslashes before a quote: every JSON string
    # around it, nested or not, stays valid
    ("aws_access_key", _keyed("[A-Z0-9]", "AKIA|ASIA") + r"[0-9A-Z]{16}(?![A-Z0-9])", ("AKIA", "ASIA")),
    (
        "aws_secret_key",
        # the separator is group 1 and stays (as for password=): it may hold a string's closing quote
        r"(?i)(?<=aws_secret_access_key)(" + _SEP + r")[A-Za-z0-9/+]{40}",
        ("secret",),
    ),
    (
        "github_token",
        # (ghp_..., and fine-grained github_pat_...: both start with "g", the literal the boundary needs)
        _keyed("[A-Za-z0-9_]", "g") + r"(?:h[pousr]_[A-Za-z0-9]{30,}|ithub_pat_[A-Za-z0-9_]{22,})",
        (r"g(?:h[pousr]_|ithub_pat_)",),
    ),
    ("anthropic_key", _keyed("[A-Za-z0-9_]", "sk-") + r"ant-[A-Za-z0-9_\-]{20,}", ("sk-ant-",)),
    (
        "openai_key",
        # a bare sk-... after "-" is a near miss (task-sk-...); one with its proj-/svcacct-/admin- prefix
        # is a key there too (Claude Code's project folder for a cwd /home/dev/sk-proj-...: -home-dev-sk-proj-...)
        # (one leading literal for both boundaries: ``re`` keeps its fast prefix search)
        r"(?:sk-)(?:" + _after(r"[A-Za-z0-9_\-]", "sk-") + r"(?:proj-|svcacct-|admin-)?"
        r"|" + _after("[A-Za-z0-9_]", "sk-") + r"(?:proj-|svcacct-|admin-))[A-Za-z0-9_\-]{20,}",
        ("sk-",),
    ),
    (
        "slack_token",
        # (a webhook URL also URL-encoded, as a query parameter: ``/`` -> ``%2F``)
        _keyed("[A-Za-z0-9]", "xox") + r"[abposr]-[A-Za-z0-9\-]{10,}"
        r"|https://hooks\.slack\.com/services/[A-Za-z0-9/_\-]+"
        rf"|hooks\.slack\.com{_PCT}2[Ff]services{_PCT}2[Ff](?:[A-Za-z0-9_\-]|{_PCT}2[Ff])+",
        ("xox", r"hooks\.slack\.com"),
    ),
    ("google_api_key", _keyed("[A-Za-z0-9]", "AIza") + r"[0-9A-Za-z_\-]{35}", ("AIza",)),
    ("jwt", _keyed("[A-Za-z0-9]", "eyJ") + r"[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}", ("eyJ",)),
]

# ``password = "..."``, ``DB_PASSWORD: ...``, ``"api_key": "..."`` (also inside JSON-escaped strings).
# Only the value is replaced; values shorter than 6 characters (``pwd: str``) are left alone.
_ASSIGN_NAMES = (
    r"password|passwd|pwd|secret|client[_\-]?secret|secret[_\-]?key|api[_\-]?key|access[_\-]?token"
    r"|auth[_\-]?token|refresh[_\-]?token|private[_\-]?key"
)
_ASSIGN_BODY = (
    r"((?:" + _ASSIGN_NAMES + r")" + _SEP + r")"
    r"(?!\[REDACTED)([^\s\"'\\,;&<>(){}\[\]`]{6,})"
)
_ASSIGN = "(?i)" + _start("[A-Za-z0-9]") + _ASSIGN_BODY
# on the lower-cased text: every name above starts with one of these
_ASSIGN_PRECHECK = ("pass", "pwd", "secret", "client", "api", "access", "auth", "refresh", "private")
# the same pattern anchored at a precheck hit (the bytes path matches only there: no scanning)
_ASSIGN_AT = re.compile(("(?i)" + _ASSIGN_BODY).encode())
_ALNUM = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")

KINDS = [k for k, _, _ in _BUILTIN] + ["password_assignment"]

# Prefilter: a line that holds no match of any of these cannot hold a match of any built-in kind.
# Each alternative is its kinds' exact pattern with the lookarounds left out (and ``{n,}`` cut to
# ``{n}``), which only widens it, so it stays a superset while benign lines (``task-id``, a message
# id holding ``xox``) stop being candidates: the exact pass then runs on almost nothing.
# (source, caseless). Run by Hyperscan when installed (one SIMD pass, ~2.5 GB/s here), else by RE2
# through pyarrow.compute (~0.2-0.3 GB/s); both fold case at least as widely as Python's ASCII ``(?i)``.
# _ASSIGN's value class (``\s`` spelled out)
_VALUE_CHAR = r"""[^ \t\n\r\f\v"'\\,;&<>(){}\[\]`]"""

# Hidden spellings of a key: an invisible character inside it (zero-width space, non-joiner and joiner,
# word joiner, BOM, soft hyphen: a key copied from a web page or a chat) or one of its letters or digits
# written as an HTML numeric entity (``&#65;KIA...``). A line (or text) holding one is scrubbed again as
# a reader sees it, invisible characters removed and those entities decoded, and kept in that form when
# that finds a secret the line as written hid (the line's other content is unchanged but for them).
# As raw JSONL bytes: the UTF-8 of the characters, or their ``\uXXXX`` escapes at any nesting depth
# (the whole run of backslashes goes with an escape, so every JSON string around it stays valid).
_INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff\u00ad"
_INVISIBLE_BYTES = r"\xe2\x80[\x8b-\x8d]|\xe2\x81\xa0|\xef\xbb\xbf|\xc2\xad"
_INVISIBLE_ESCAPE = r"\\\\*u(?:200[bcdBCD]|2060|[fF][eE][fF][fF]|00[aA][dD])"  # (one or more backslashes)
# entities of ASCII letters and digits only (``&#39;``, an apostrophe, hides nothing)
_ALNUM_ENTITY = r"&#(?:0*(?:4[89]|5[0-7]|6[5-9]|[78][0-9]|9[07-9]|1[01][0-9]|12[0-2])|[xX]0*(?:3[0-9]|[46][1-9a-fA-F]|[57][0-9aA]));"
_HIDDEN_PART = "|".join((_INVISIBLE_BYTES, _INVISIBLE_ESCAPE, _ALNUM_ENTITY))
# every alternative starts with a literal byte (no group, no repeat in front), so Python's re skips
# straight to the bytes that can start one: ~5x faster on a long line (a 5.7 KB web result, 85 -> 17 us)
_HIDDEN_BYTES = re.compile(_HIDDEN_PART.encode())
_HIDDEN_STR = re.compile(f"[{_INVISIBLE}]|({_ALNUM_ENTITY})")


def _entity_char(entity: str) -> str:
    """``&#65;`` / ``&#x41;`` -> ``A``."""
    body = entity[2:-1]
    return chr(int(body[1:], 16) if body[:1] in "xX" else int(body))


def _shown_bytes(line: bytes) -> bytes:
    """A raw line as a reader sees its text: invisible characters (and their escapes) removed, entities of
    letters and digits decoded."""

    return _HIDDEN_BYTES.sub(
        lambda m: _entity_char(m.group().decode()).encode() if m.group()[:1] == b"&" else b"", line
    )


def _shown_text(text: str) -> str:
    return _HIDDEN_STR.sub(lambda m: _entity_char(m.group(1)) if m.group(1) else "", text)


PREFILTER_PARTS: list[tuple[str, bool]] = [
    ("PRIVATE KEY-----", False),
    ("(?:AKIA|ASIA)[0-9A-Z]{16}", False),
    ("aws_secret_access_key" + _QUOTE + _BLANKS + "(?:[:=]|" + _PCT + "3[AaDd])", True),
    ("gh[pousr]_[A-Za-z0-9]{30}", False),
    ("github_pat_[A-Za-z0-9_]{22}", False),
    # anthropic (sk-ant-...) and openai (sk-proj-...) alike
    (r"sk-[A-Za-z0-9_\-]{20}", False),
    (r"xox[abposr]-[A-Za-z0-9\-]{10}", False),
    (r"hooks\.slack\.com[/%]", False),  # (also URL-encoded: %2F)
    (r"AIza[0-9A-Za-z_\-]{35}", False),
    (r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8}", False),
    ("(?:" + _ASSIGN_NAMES + ")" + _SEP + _VALUE_CHAR + "{6}", True),
    # a hidden spelling (below): every kind runs on the line as a reader sees it
    (_HIDDEN_PART, False),
]
PREFILTER = "|".join(f"(?i:{src})" if ci else src for src, ci in PREFILTER_PARTS)  # the RE2 form
# The kinds each part stands for: every match of a kind contains a match of one of its own parts (the
# part is that kind's exact pattern widened). Hyperscan reports which part matched on which line, so
# only those kinds' exact patterns run on that line (a kind whose parts did not match the line cannot
# match it, neither before nor after an earlier kind's replacement: no pattern matches across a tag).
PREFILTER_KINDS: list[tuple[str, ...]] = [
    ("private_key",),
    ("aws_access_key",),
    ("aws_secret_key",),
    ("github_token",),
    ("github_token",),
    ("anthropic_key", "openai_key"),
    ("slack_token",),
    ("slack_token",),
    ("google_api_key",),
    ("jwt",),
    ("password_assignment",),
    (),  # (the hidden spellings: _HIDDEN_BIT)
]
assert len(PREFILTER_KINDS) == len(PREFILTER_PARTS)


# what a token of each variable-length kind may go on with past a seam (8+ characters of its body: a
# shorter rest tells little). Not here: the fixed-length kinds (AWS, Google) end where their match ends;
# a PEM body or a password= value would take the words of a next block that starts a sentence
_CONTINUES = {
    kind: re.compile(cls + "{8,}")
    for kind, cls in (
        ("github_token", "[A-Za-z0-9_]"),
        ("anthropic_key", r"[A-Za-z0-9_\-]"),
        ("openai_key", r"[A-Za-z0-9_\-]"),
        ("slack_token", r"[A-Za-z0-9/_\-]"),
        ("jwt", r"[A-Za-z0-9_\-.]"),
    )
}
_TAG_AT_END = re.compile(r"\[REDACTED:([a-z_]+)\]\Z")

_REGEX_CHARS = set("\\()[]|?*+{}")


class _Pattern:
    """One secret kind. ``pre``: prechecks every match contains; for a case-insensitive ``(?i)``
    pattern they are lower-case and run on the lower-cased text."""

    __slots__ = ("kind", "source", "_rs", "_rb", "pre", "assign", "keep", "tag", "repl")

    def __init__(self, kind: str, source: str, prechecks: tuple[str, ...], assign: bool = False, keep: bool = False):
        self.kind = kind
        self.source = source
        self._rs: re.Pattern[str] | None = None
        self._rb: re.Pattern[bytes] | None = None
        # an extra pattern: compiled now, so a bad one is refused when the recipe is read
        if not prechecks:
            self._rs, self._rb = re.compile(source), re.compile(source.encode())
        ci = source.startswith("(?i)")
        if ci and any(p != p.lower() for p in prechecks):
            raise ValueError(f"{kind}: prechecks of a case-insensitive pattern must be lower-case")
        # (key, is_regex, lowered, literal-or-compiled)
        self.pre = tuple(
            (p, bool(_REGEX_CHARS & set(p)), ci, re.compile(p.encode()) if _REGEX_CHARS & set(p) else p.encode())
            for p in prechecks
        )
        self.assign = assign
        # the replacement keeps group 1 (name and separator) before the tag
        self.keep = keep or assign
        self.tag = f"[REDACTED:{kind}]".encode()
        self.repl = (lambda m, t=self.tag: m.group(1) + t) if self.keep else self.tag  # for ``rb.subn``

    # The built-in kinds compile on first use: the prefilter and the prechecks rule most kinds out of most
    # processes (all ten compiled up front cost ~0.005 CPU-s of every ingest).
    @property
    def rs(self) -> re.Pattern[str]:
        if self._rs is None:
            self._rs = re.compile(self.source)
        return self._rs

    @property
    def rb(self) -> re.Pattern[bytes]:
        if self._rb is None:
            self._rb = re.compile(self.source.encode())
        return self._rb

    def hit_in(self, text: str) -> bool:
        low = None
        for key, is_re, lowered, _ in self.pre:
            hay = text
            if lowered:
                low = low if low is not None else text.lower()
                hay = low
            if re.search(key, hay) if is_re else key in hay:
                return True
        return False


_COMPILED: dict[tuple, list[_Pattern]] = {}


def _compiled(extra: tuple[tuple[str, str], ...]) -> list[_Pattern]:
    """The compiled patterns for a set of extra patterns, built once per process (one Scrubber per
    session would otherwise recompile them for every session)."""
    got = _COMPILED.get(extra)
    if got is None:
        got = [_Pattern(k, s, pre, keep=k == "aws_secret_key") for k, s, pre in _BUILTIN]
        got.append(_Pattern("password_assignment", _ASSIGN, _ASSIGN_PRECHECK, assign=True))
        for kind, source in extra:
            try:
                got.append(_Pattern(kind, source, ()))
            except re.error as e:
                raise ValueError(f"extra_secret_patterns[{kind!r}] is not a valid regex: {e}") from None
        _COMPILED[extra] = got
    return got


class Scrubber:
    """Replace secrets; ``counts`` accumulates per-kind replacements over every call."""

    def __init__(self, extra_patterns: dict[str, str] | None = None):
        self.patterns = list(_compiled(tuple((str(k), str(v)) for k, v in (extra_patterns or {}).items())))
        self.builtin = [p for p in self.patterns if p.pre]
        self.extra = [p for p in self.patterns if not p.pre]
        self.counts: Counter[str] = Counter()

    def scrub(self, text: str) -> str:
        if "&#" in text or any(ch in text for ch in _INVISIBLE):  # a hidden spelling (see _INVISIBLE)
            shown = _shown_text(text)
            # as in _scrub_shown: as written, unless the spelling hid a secret
            if shown != text:
                as_written: Counter[str] = Counter()
                as_shown: Counter[str] = Counter()
                written = self._scrub_text(text, as_written)
                seen = self._scrub_text(shown, as_shown)
                text, found = (seen, as_shown) if seen != _shown_text(written) else (written, as_written)
                self.counts.update(found)
                return text
        return self._scrub_text(text, self.counts)

    def _scrub_text(self, text: str, counts: Counter) -> str:
        for p in self.patterns:
            if p.pre and not p.hit_in(text):
                continue
            repl = (lambda m, k=p.kind: m.group(1) + f"[REDACTED:{k}]") if p.keep else f"[REDACTED:{p.kind}]"
            text, n = p.rs.subn(repl, text)
            if n:
                counts[p.kind] += n
        return text

    def scrub_seams(self, pieces: list[str], reach: int = 4096) -> list[str]:
        """Pieces a reader sees one after another (a message's text blocks, a tool call's string
        arguments), each already scrubbed: a secret split across the seam of two neighbours, which
        neither half matches, is found in their concatenation (the last and first ``reach``
        characters) and redacted in both, the first from where the match starts, the second up to
        where it ends (after a ``name=`` the name and separator stay, as in :meth:`scrub`)."""
        out = list(pieces)
        for i in range(len(out) - 1):
            a, b = out[i], out[i + 1]
            if not a or not b:
                continue
            tail, head = a[-reach:], b[:reach]
            joined, seam = tail + head, len(tail)
            for p in self.patterns:
                if p.pre and not p.hit_in(joined):
                    continue
                m = next((m for m in p.rs.finditer(joined) if m.start() < seam < m.end()), None)
                if m is None:
                    continue
                start = m.end(1) if p.keep else m.start()
                # (only the value's head is in b: b alone is cut)
                if start >= seam:
                    b = f"[REDACTED:{p.kind}]" + b[m.end() - seam :]
                else:
                    a = a[: len(a) - seam + start] + f"[REDACTED:{p.kind}]"
                    b = f"[REDACTED:{p.kind}]" + b[m.end() - seam :]
                self.counts[p.kind] += 1
                # (one seam, one secret: the halves are now tags)
                break
            else:
                # a first half long enough to match alone was redacted where it was scrubbed (ingest, one
                # line per block): the seam then shows a tag and the key's rest, which matches nothing
                tag = _TAG_AT_END.search(a)
                kind = tag.group(1) if tag else ""
                rest = _CONTINUES.get(kind)
                m = rest.match(b) if rest else None
                if m:
                    b = f"[REDACTED:{kind}]" + b[m.end() :]
                    self.counts[kind] += 1
            out[i], out[i + 1] = a, b
        return out

    def scrub_bytes(self, data: bytes, backend: str = "auto") -> bytes:
        """The ingest hot path over a whole file buffer.

        One pass of the prefilter (:data:`PREFILTER_PARTS`, Hyperscan or RE2) marks the lines that could hold
        a built-in secret and, with Hyperscan, which kinds (:data:`PREFILTER_KINDS`); only those kinds'
        exact patterns run, in order, on only those lines (:meth:`line_splices`). Every built-in kind
        matches within one line, so a line the prefilter rejects is left unchanged by every kind and
        per-line scrubbing equals scrubbing the whole buffer (tests/ingest/test_scrub.py checks both).
        Extra recipe patterns then run on the whole buffer.
        """
        data = apply_splices(data, self.line_splices(data, backend))
        for p in self.extra:
            data, n = p.rb.subn(f"[REDACTED:{p.kind}]".encode(), data)
            if n:
                self.counts[p.kind] += n
        return data

    def line_splices(self, data: bytes, backend: str = "auto") -> list[tuple[int, int, bytes]]:
        """The built-in kinds over a file buffer, as ``(start, end, scrubbed line)`` for each line they
        change (``data[start:end]``, newline excluded, in file order): :func:`apply_splices` gives the
        scrubbed buffer; the native ingest engine reads the lines in place instead (no copy of the
        file). Counts are added as :meth:`scrub_bytes` adds them. Extra patterns are not applied."""
        out: list[tuple[int, int, bytes]] = []
        hits = _candidate_hits(data, backend)
        # nearly every file of a session has no candidate line
        if not hits:
            return out
        found: Counter[str] = Counter()
        for start, end, kinds in hits:
            old = data[start:end]
            line = self._scrub_line(old, kinds, found)
            if line is not old:
                out.append((start, end, line))
        # counts enter in pattern order, as a whole-buffer pass adds them (none found: no lookup per kind)
        if found:
            for p in self.builtin:
                if found[p.kind]:
                    self.counts[p.kind] += found[p.kind]
        return out

    def _scrub_line(self, line: bytes, kinds: int, counts: Counter) -> bytes:
        """The built-in kinds whose bit (index in :attr:`builtin`) is set in ``kinds``, in order, over one
        line (no newline in it); with :data:`_HIDDEN_BIT`, see :meth:`_scrub_shown`. Returns ``line``
        itself when nothing matched."""
        if kinds & _HIDDEN_BIT:
            shown = _shown_bytes(line)
            if shown != line:
                new, _ = self._scrub_shown(line, shown, counts, kinds)
                return new
        for i, p in enumerate(self.builtin):
            if not kinds >> i & 1:
                continue
            if p.assign:
                new, n = _scrub_assignments(line, line.lower(), p, p.tag)
            else:
                new, n = p.rb.subn(p.repl, line)
            if n:
                line = new
                counts[p.kind] += n
        return line

    def _scrub_shown(self, line: bytes, shown: bytes, counts: Counter, kinds: int | None = None) -> tuple[bytes, bool]:
        """A line with a hidden spelling (see ``_INVISIBLE``), scrubbed as written or, when that spelling hid
        a secret, as shown (``shown``: :func:`_shown_bytes` of it): it hid one when scrubbing the shown
        line differs from showing the scrubbed one. (The scrubbed line, whether it is the shown one.)

        ``kinds``: what the prefilter reported for ``line`` (:func:`_candidate_hits`; None: the exact path,
        every kind). From Hyperscan (not RE2's ``_ALL_KINDS``), only those kinds run on the line as
        written, and on the shown line only the kinds whose prefilter parts match it (one more scan): a
        kind none of whose parts matches a text cannot match it (``PREFILTER_KINDS``). A zero-width
        joiner in an emoji, common in real sessions, so costs a scan instead of every pattern twice."""
        as_written: Counter[str] = Counter()
        as_shown: Counter[str] = Counter()
        kinds = _ALL_KINDS if kinds is None else kinds
        shown_kinds = _BUILTIN_BITS if kinds == _ALL_KINDS else _line_kinds(shown)
        written = self._scrub_line(line, kinds & _BUILTIN_BITS, as_written)
        seen = self._scrub_line(shown, shown_kinds, as_shown)
        if seen != (shown if written is line else _shown_bytes(written)):
            counts.update(as_shown)
            return seen, True
        counts.update(as_written)
        return written, False

    def _scrub_lines(self, data: bytes, counts: Counter | None = None) -> bytes:
        """The built-in kinds over a buffer of lines (the exact path; also correct on a whole file).

        Each precheck is located with ``bytes.find`` (or a literal-prefixed regex) once per buffer
        and shared between kinds; a kind's regex then runs only on the lines holding a hit (no
        pattern matches across a newline in JSONL and every match contains a precheck, so this
        equals running it on the whole buffer: tests/ingest/test_scrub.py checks exactly that).
        """
        counts = self.counts if counts is None else counts
        pieces: list[bytes] = []
        pos = 0
        for start, end in _line_spans(data, data, _HIDDEN_BYTES):  # a line a hidden spelling changes
            line = data[start:end]
            shown = _shown_bytes(line)
            if shown != line:
                found: Counter[str] = Counter()
                new, as_shown = self._scrub_shown(line, shown, found)
                # scrubbed as shown here (the passes below find no more in it)
                if as_shown:
                    counts.update(found)
                    pieces += (data[pos:start], new)
                    pos = end
        data = b"".join([*pieces, data[pos:]]) if pieces else data
        lowered: bytes | None = None
        spans_cache: dict[str, list[tuple[int, int]]] = {}
        for p in self.builtin:
            tag, repl = p.tag, p.repl
            if p.assign:
                lowered = data.lower() if lowered is None else lowered
                data, n = _scrub_assignments(data, lowered, p, tag)
                if n:
                    counts[p.kind] += n
                    lowered, spans_cache = None, {}
                continue
            spans: set[tuple[int, int]] = set()
            for key, _is_re, low, needle in p.pre:
                got = spans_cache.get(key)
                if got is None:
                    if low:
                        lowered = data.lower() if lowered is None else lowered
                        hay = lowered
                    else:
                        hay = data
                    got = spans_cache[key] = _line_spans(data, hay, needle)
                spans.update(got)
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
                counts[p.kind] += total
                lowered, spans_cache = None, {}  # offsets moved
        return data


def apply_splices(data: bytes, splices: list[tuple[int, int, bytes]]) -> bytes:
    """``data`` with each ``(start, end, text)`` of :meth:`Scrubber.line_splices` put in place. Views, not
    slices: the unchanged stretches (almost the whole file) are copied once, by the join."""
    if not splices:
        return data
    view = memoryview(data)
    pieces: list[bytes | memoryview] = []
    pos = 0
    for start, end, text in splices:
        pieces += (view[pos:start], text)
        pos = end
    pieces.append(view[pos:])
    return b"".join(pieces)


_HEX = frozenset(b"0123456789abcdefABCDEF")
_PERCENT_BYTES = tuple(p.encode() for p in _PERCENT)


def starts_word(data: bytes, i: int) -> bool:
    """``_start("[A-Za-z0-9]")`` at offset ``i`` of ``data``: no letter or digit before it, or an escape
    (backslash + ``nrtbf``, ``\\uXXXX``, or a URL's ``%XX``, ``%25XX``, ``%2525XX``) right before it."""
    if i == 0 or data[i - 1] not in _ALNUM:
        return True
    if i >= 2 and data[i - 2] == 92 and data[i - 1] in b"nrtbf":
        return True
    # %XX (a URL escape, encoded up to 3 times)
    if i >= 3 and data[i - 2] in _HEX and data[i - 1] in _HEX:
        if any(data[max(0, i - 2 - len(p)) : i - 2] == p for p in _PERCENT_BYTES):
            return True
    return i >= 6 and data[i - 6] == 92 and data[i - 5] == 117 and all(c in _HEX for c in data[i - 4 : i])


def _scrub_assignments(data: bytes, lowered: bytes, p: _Pattern, tag: bytes) -> tuple[bytes, int]:
    """``name = value`` secrets: try the anchored pattern only where a name starts."""
    cuts: list[tuple[int, int]] = []
    for _key, _is_re, _low, needle in p.pre:
        i = _find(lowered, needle, 0)
        while i != -1:
            if starts_word(data, i):
                m = _ASSIGN_AT.match(data, i)
                if m:
                    cuts.append((m.start(2), m.end(2)))
            i = _find(lowered, needle, i + 1)
    if not cuts:
        return data, 0
    pieces, pos = [], 0
    for a, b in sorted(set(cuts)):
        # overlapping hit (e.g. "client_secret" and "secret"): already cut
        if a < pos:
            continue
        pieces.append(data[pos:a])
        pieces.append(tag)
        pos = b
    pieces.append(data[pos:])
    return b"".join(pieces), len(pieces) // 2


# compiled Hyperscan database (False: unavailable -> RE2)
_HS_DB = None


def _hyperscan_db():
    global _HS_DB
    if _HS_DB is None:
        try:
            import hyperscan

            _HS_DB = _hyperscan_cached(hyperscan) or _hyperscan_compile(hyperscan)
        # not installed (non-x86) or cannot compile here: RE2 path
        except Exception:
            _HS_DB = False
    return _HS_DB


def _hyperscan_compile(hyperscan):
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(
        expressions=[src.encode() for src, _ in PREFILTER_PARTS],
        ids=list(range(len(PREFILTER_PARTS))),
        elements=len(PREFILTER_PARTS),
        flags=[hyperscan.HS_FLAG_CASELESS if ci else 0 for _, ci in PREFILTER_PARTS],
    )
    path = _hyperscan_cache_path()
    # best effort: an unwritable cache only means compiling again next time
    try:
        blob = hyperscan.dumpb(db)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(hashlib.sha256(blob).digest() + blob)
        # atomic: concurrent processes never read half a file
        os.replace(tmp, path)
    except Exception:
        pass
    return db


def _hyperscan_cache_path() -> Path:
    """Compiling the prefilter costs ~0.05-0.09 CPU-s, every process; its serialized database is kept
    under ``$COMPOSER_PIPELINE_HOME`` (default ``~/.cache/composer-pipeline``, as the ledger and the
    response cache; patterns only, never data), named by the patterns."""
    key = hashlib.sha256(repr(PREFILTER_PARTS).encode()).hexdigest()[:16]

    return default_home() / f"secret-prefilter-{key}.hsdb"


def _hyperscan_cached(hyperscan):
    """The cached database, or None (missing, damaged, or built by another Hyperscan version or CPU:
    ``loadb`` refuses those and the caller compiles afresh)."""
    try:
        raw = _hyperscan_cache_path().read_bytes()
        digest, blob = raw[:32], raw[32:]
        if hashlib.sha256(blob).digest() != digest:
            return None
        db = hyperscan.loadb(blob, hyperscan.HS_MODE_BLOCK)
        # a loaded database comes without scratch space
        db.scratch = hyperscan.Scratch(db)
        return db
    except Exception:
        return None


def _candidate_lines(data: bytes, backend: str = "auto") -> list[tuple[int, int]]:
    """(start, end) of the lines of ``data`` (split on ``\\n``, end exclusive) that match the prefilter.

    ``backend``: ``"auto"`` (Hyperscan if available, else RE2), ``"hyperscan"`` or ``"re2"``."""
    return [(start, end) for start, end, _ in _candidate_hits(data, backend)]


# part id -> bit mask over the built-in kinds (bit i: KINDS[i], the order of Scrubber.builtin)
# the line holds a hidden spelling: every kind runs on it as shown
_HIDDEN_BIT = 1 << len(KINDS)
_PART_BITS = [sum(1 << KINDS.index(k) for k in kinds) or _HIDDEN_BIT for kinds in PREFILTER_KINDS]
_BUILTIN_BITS = (1 << len(KINDS)) - 1
_ALL_KINDS = _BUILTIN_BITS | _HIDDEN_BIT


def _candidate_hits(data: bytes, backend: str = "auto") -> list[tuple[int, int, int]]:
    """(start, end, kinds) of the candidate lines, in order: ``kinds`` is the bit mask (over
    :data:`KINDS`) of the kinds whose prefilter parts matched the line (RE2, which reports no part: all)."""
    if not data:
        return []
    db = _hyperscan_db() if backend != "re2" else None
    if db:
        hits: list[tuple[int, int]] = []
        db.scan(data, match_event_handler=lambda part, _from, to, _flags, _ctx: hits.append((to, part)))
        hits.sort()
        lines: list[tuple[int, int, int]] = []
        line_end, start, kinds = -1, 0, 0
        # a match never spans a newline; its last byte (to - 1) is not one
        for to, part in hits:
            # a new line: close the one found last (linear even for many hits per line)
            if to > line_end:
                if kinds:
                    lines.append((start, line_end, kinds))
                start = data.rfind(b"\n", 0, to) + 1
                line_end = data.find(b"\n", to)
                if line_end == -1:
                    line_end = len(data)
                kinds = 0
            kinds |= _PART_BITS[part]
        if kinds:
            lines.append((start, line_end, kinds))
        return lines
    if backend == "hyperscan":
        raise RuntimeError("hyperscan is not available")
    return [(start, end, _ALL_KINDS) for start, end in _candidate_lines_re2(data)]


def _line_kinds(line: bytes) -> int:
    """The built-in kinds whose prefilter parts match ``line`` (Hyperscan, as :func:`_candidate_hits`)."""
    kinds = 0

    def on(part, _from, _to, _flags, _ctx):
        nonlocal kinds
        kinds |= _PART_BITS[part]

    _hyperscan_db().scan(line, match_event_handler=on)
    return kinds & _BUILTIN_BITS


def _candidate_lines_re2(data: bytes) -> list[tuple[int, int]]:
    """RE2 over the file's lines as a zero-copy Arrow binary array (offsets = newline positions)."""
    # only where Hyperscan is missing: importing them costs ~0.03 (pyarrow.compute) and ~0.055 CPU-s
    # (numpy) of every ingest process
    import numpy as np
    import pyarrow.compute as pc

    nl = np.flatnonzero(np.frombuffer(data, np.uint8) == 10)
    starts = np.empty(len(nl) + 1, np.int64)
    starts[0] = 0
    starts[1:] = nl + 1
    ends = np.append(nl, len(data))  # exclusive, without the newline
    # value i spans starts[i]..starts[i+1] (its newline included: harmless, no part matches one)
    lines = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(starts), [None, pa.py_buffer(np.append(starts, len(data))), pa.py_buffer(data)]
    )
    # (no .to_numpy(): the ingest CLI's pyarrow is loaded without numpy, cli/ingest.py)
    hit = pc.indices_nonzero(pc.match_substring_regex(lines, PREFILTER)).to_pylist()
    return [(int(starts[i]), int(ends[i])) for i in hit]


def _find(hay: bytes, needle: re.Pattern[bytes] | bytes, pos: int) -> int:
    """The offset of the first occurrence of ``needle`` (a literal or a regex) in ``hay`` from ``pos``, or -1."""
    if isinstance(needle, bytes):
        return hay.find(needle, pos)
    m = needle.search(hay, pos)
    return m.start() if m else -1


def _line_spans(data: bytes, hay: bytes, needle: re.Pattern[bytes] | bytes) -> list[tuple[int, int]]:
    """(start, end) of every line of ``data`` in which ``needle`` occurs in ``hay`` (same offsets)."""
    out = []
    i = _find(hay, needle, 0)
    while i != -1:
        start = data.rfind(b"\n", 0, i) + 1
        end = data.find(b"\n", i)
        end = len(data) if end == -1 else end
        out.append((start, end))
        i = _find(hay, needle, end)
    return out


def scan(text: str, extra_patterns: dict[str, str] | None = None) -> dict[str, int]:
    """Count secrets in ``text`` per kind without keeping the scrubbed text (asset checks)."""
    s = Scrubber(extra_patterns)
    s.scrub(text)
    return dict(s.counts)


def scrub_obj(obj, scrubber: Scrubber | None = None):
    """A decoded JSON value with every string in it (object keys included) scrubbed: what a teacher
    answered, before it is cached, stored in ``teacher_replays`` or logged."""
    s = scrubber or Scrubber()
    if isinstance(obj, str):
        return s.scrub(obj)
    if isinstance(obj, list):
        return [scrub_obj(v, s) for v in obj]
    if isinstance(obj, dict):
        return {s.scrub(k) if isinstance(k, str) else k: scrub_obj(v, s) for k, v in obj.items()}
    return obj
