"""Money per request: the conservative prompt-token estimate, worst case, and actual cost.

In:  a request body (OpenAI chat-completions JSON) and a :class:`TeacherConfig`.
Out: estimated prompt tokens, the worst-case USD reserved before sending, the actual USD from the
     ``usage`` the teacher reports.

Deliberately simplified: the prompt estimate is tokenizer-free, and a true upper bound for the
tokenizers chat models use: byte-level BPE (GPT/Qwen/Llama-3 style) and SentencePiece with byte
fallback never make a token of less than one byte of text, so the UTF-8 bytes of the serialized
messages and tools (JSON escaping only adds bytes) bound the text tokens, and a per-message and
fixed allowance covers the chat template's special tokens. Real prompts average 3.5–4.5 bytes per
token on English and code, so this over-reserves by about 4×; reservations are released on settle,
so the margin only limits how many calls may be in flight at the edge of a budget, never what is
spent. With ``max_tokens`` always sent, the worst case bounds what an honest provider can bill; a
provider that bills beyond it is recorded at what it billed (and shows up in the spend checks).
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from composer_pipeline.teachers.config import TeacherConfig

BYTES_PER_TOKEN = 1.0  # no token covers less than one byte (see module docstring)
TOKENS_PER_MESSAGE = 8  # role markers, separators, tool-call framing of chat templates
TOKENS_FIXED = 32  # generation prompt, BOS, tool-list framing


def estimate_prompt_tokens(body: dict[str, Any]) -> int:
    """Upper bound of the prompt tokens of a chat request (see module docstring)."""
    messages = body.get("messages") or []
    tools = body.get("tools") or []
    n_bytes = len(orjson.dumps(messages)) + (len(orjson.dumps(tools)) if tools else 0)
    return int(math.ceil(n_bytes / BYTES_PER_TOKEN)) + TOKENS_PER_MESSAGE * len(messages) + TOKENS_FIXED


def usd(tokens_in: int, tokens_out: int, teacher: TeacherConfig) -> float:
    return tokens_in * teacher.input_usd_per_mtok / 1e6 + tokens_out * teacher.output_usd_per_mtok / 1e6


def worst_case_usd(body: dict[str, Any], teacher: TeacherConfig) -> tuple[int, float]:
    """(estimated prompt tokens, worst-case cost = estimate × input price + max_tokens × output price)."""
    est = estimate_prompt_tokens(body)
    max_out = int(body.get("max_tokens") or teacher.max_tokens)
    return est, usd(est, max_out, teacher)


def usage_cost(usage: dict[str, Any] | None, teacher: TeacherConfig) -> tuple[int | None, int | None, float | None]:
    """(prompt_tokens, completion_tokens, USD) from a response ``usage``; Nones when it is unusable."""
    if not isinstance(usage, dict):
        return None, None, None
    p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(p, int) or not isinstance(c, int) or isinstance(p, bool) or isinstance(c, bool) or p < 0 or c < 0:
        return None, None, None
    return p, c, usd(p, c, teacher)
