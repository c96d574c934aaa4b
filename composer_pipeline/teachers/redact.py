"""The teacher's own API key removed from everything a teacher sends back, in every form it may take.

In:  a JSON-like object (a response, a reason text) and the key that was sent with the request.
Out: the same object with every occurrence of the key replaced by ``[REDACTED]``: as written, stripped of
     surrounding whitespace, JSON-escaped, URL-encoded (``quote`` and ``quote_plus``) and Python-repr
     escaped (how an exception's message shows a header value). Keys of dicts too.

The pattern scrubber (``composer_pipeline.scrub``) finds secrets by their look; this removes the one
secret known literally, whatever it looks like (a self-hosted gateway's key has no known prefix).
Deliberately simplified: keys shorter than 8 characters are not searched for (every answer would be
mangled for a key like ``x``; such a value is not a secret worth the name), and encodings other than
the ones above (base64, hex) are not tried.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, quote_plus

import orjson

REDACTED = "[REDACTED]"
MIN_KEY_LEN = 8


def key_forms(key: str | None) -> list[str]:
    """The key and its encodings, longest first (so a longer form is replaced before a shorter one inside it)."""
    if not key or len(key.strip()) < MIN_KEY_LEN:
        return []
    forms = set()
    for k in {key, key.strip()}:
        forms |= {k, orjson.dumps(k).decode()[1:-1], quote(k, safe=""), quote_plus(k), repr(k)[1:-1]}
    return sorted(forms, key=len, reverse=True)


def redact_text(text: str, forms: list[str]) -> str:
    for f in forms:
        if f in text:
            text = text.replace(f, REDACTED)
    return text


def redact_key(obj: Any, key: str | None) -> Any:
    """``obj`` with the key removed from every string in it (dict keys included); unchanged without a key."""
    forms = key_forms(key)
    if not forms:
        return obj

    def walk(o: Any) -> Any:
        if isinstance(o, str):
            return redact_text(o, forms)
        if isinstance(o, dict):
            return {walk(k) if isinstance(k, str) else k: walk(v) for k, v in o.items()}
        if isinstance(o, list):
            return [walk(v) for v in o]
        return o

    return walk(obj)
