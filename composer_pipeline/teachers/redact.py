"""The teacher's own API key removed from everything a teacher sends back, in every form it may take.

In:  a JSON-like object (a response, a reason text) and the key that was sent with the request.
Out: the same object with every occurrence of the key replaced by ``[REDACTED]`` (keys of dicts too).

An occurrence is the key (surrounding whitespace stripped) with each of its characters written as
itself or in any escaped form: JSON-escaped at any nesting depth (``\\/``, as PHP's ``json_encode``
writes a slash, ``\\"``, ``\\\\``, ``\\u00XX`` in either case, with any run of backslashes before
it), URL-encoded (``%XX``, also ``%25XX`` once more encoded) or Python-repr escaped (``\\'``), in
any mix. A cut-off copy of the key counts too: a run of its first characters at least
:func:`prefix_len` long (a provider that echoes the start of a key, or a text cut inside one).
Redaction comes before any truncation of a text (``client._scrub``).

The pattern scrubber (``composer_pipeline.scrub``) finds secrets by their look; this removes the one
secret known literally, whatever it looks like (a self-hosted gateway's key has no known prefix).
Deliberately simplified: keys shorter than 8 characters are not searched for (every answer would be
mangled for a key like ``x``; such a value is not a secret worth the name), a prefix shorter than a
quarter of the key is left (it names the key's scheme, ``sk-proj-``, more than the key), and
encodings other than the ones above (base64, hex) are not tried.
"""

from __future__ import annotations

import functools
import re
from typing import Any

REDACTED = "[REDACTED]"
MIN_KEY_LEN = 8


def prefix_len(key: str) -> int:
    """The shortest run of the key's first characters that is redacted as the key: a quarter of it, at
    least :data:`MIN_KEY_LEN` characters (the whole key when it is shorter)."""
    return min(len(key), max(MIN_KEY_LEN, len(key) // 4))


def _hex(code: int, digits: int) -> str:
    """``code`` in hex as a regex that takes either case of its letters."""
    return "".join(f"[{h}{h.upper()}]" if h.isalpha() else h for h in f"{code:0{digits}x}")


def _char_form(ch: str) -> str:
    """A regex for one character of the key as itself or escaped (JSON at any depth, URL, repr)."""
    code = ord(ch)
    forms = [re.escape(ch)]
    if code < 0x10000:
        forms.append(r"\\+u" + _hex(code, 4))
    if ch in "/\"'\\":
        forms.append(r"\\+" + re.escape(ch))
    if code < 0x80:
        forms.append("%(?:25)*" + _hex(code, 2))
    if ch == " ":
        forms.append(r"\+")  # (quote_plus)
    return "(?:" + "|".join(forms) + ")"


@functools.lru_cache(maxsize=16)  # one or a few keys per run
def _patterns(key: str) -> tuple[re.Pattern[str], tuple[re.Pattern[str], ...]]:
    """(the key's first :func:`prefix_len` characters in any form, each further character's form)."""
    forms = [_char_form(ch) for ch in key]
    n = prefix_len(key)
    return re.compile("".join(forms[:n])), tuple(re.compile(f) for f in forms[n:])


def redact_text(text: str, key: str | None) -> str:
    """``text`` with every occurrence of ``key`` (see the module docstring) replaced by ``[REDACTED]``."""
    key = (key or "").strip()
    if len(key) < MIN_KEY_LEN or not text:
        return text
    head, rest = _patterns(key)
    pieces: list[str] = []
    pos = 0
    for m in head.finditer(text):
        if m.start() < pos:
            continue
        end = m.end()
        # as far as the key goes on (a cut-off copy stops early)
        for form in rest:
            more = form.match(text, end)
            if more is None:
                break
            end = more.end()
        pieces += (text[pos : m.start()], REDACTED)
        pos = end
    if not pieces:
        return text
    pieces.append(text[pos:])
    return "".join(pieces)


def redact_key(obj: Any, key: str | None) -> Any:
    """``obj`` with the key removed from every string in it (dict keys included); unchanged without a key."""
    key = (key or "").strip()
    if len(key) < MIN_KEY_LEN:
        return obj

    def walk(o: Any) -> Any:
        if isinstance(o, str):
            return redact_text(o, key)
        if isinstance(o, dict):
            return {walk(k) if isinstance(k, str) else k: walk(v) for k, v in o.items()}
        if isinstance(o, list):
            return [walk(v) for v in o]
        return o

    return walk(obj)
