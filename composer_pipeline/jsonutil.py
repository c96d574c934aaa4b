"""``dumps``: orjson's compact JSON, for any value decoded from JSON.

orjson refuses integers beyond 64 bits, which are valid JSON (a tool input or usage can hold one)
and which msgspec decodes; such a value is written by the standard library instead (same compact
form and escaping; only float formatting differs, e.g. ``1e+16`` vs ``1e16``). Without this a
single such line would abort the whole ingest.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # "Integer exceeds 64-bit range"
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
