"""Money per request: the conservative prompt-token estimate, worst case, and actual cost.

In:  a request body (OpenAI chat-completions JSON) and a :class:`TeacherConfig`.
Out: estimated prompt tokens, the worst-case USD reserved before sending (always at the full input
     price, whatever the cache may save), the actual USD from the ``usage`` the teacher reports
     (cache reads and writes at their own prices, :func:`billed`).

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

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import orjson

from composer_pipeline.teachers.config import TeacherConfig

BYTES_PER_TOKEN = 1.0  # no token covers less than one byte (see module docstring)
TOKENS_PER_MESSAGE = 8  # role markers, separators, tool-call framing of chat templates
TOKENS_FIXED = 32  # generation prompt, BOS, tool-list framing


def estimate_prompt_tokens(body: dict[str, Any], n_bytes: int | None = None) -> int:
    """Upper bound of the prompt tokens of a chat request (see module docstring); ``n_bytes``: the JSON
    bytes of its messages and tools when the caller measured them already."""
    messages = body.get("messages") or []
    tools = body.get("tools") or []
    if n_bytes is None:
        n_bytes = len(orjson.dumps(messages)) + (len(orjson.dumps(tools)) if tools else 0)
    return int(math.ceil(n_bytes / BYTES_PER_TOKEN)) + TOKENS_PER_MESSAGE * len(messages) + TOKENS_FIXED


def usd(tokens_in: int, tokens_out: int, teacher: TeacherConfig) -> float:
    return tokens_in * teacher.input_usd_per_mtok / 1e6 + tokens_out * teacher.output_usd_per_mtok / 1e6


def worst_case_usd(body: dict[str, Any], teacher: TeacherConfig, n_bytes: int | None = None) -> tuple[int, float]:
    """(estimated prompt tokens, worst-case cost = estimate × input price + max_tokens × output price)."""
    est = estimate_prompt_tokens(body, n_bytes)
    max_out = int(body.get("max_tokens") or teacher.max_tokens)
    return est, usd(est, max_out, teacher)


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


@dataclass(frozen=True)
class Billed:
    """What a provider's ``usage`` says was billed, split by price: ``prompt_tokens`` counts all of them
    (uncached + cached reads + cache writes)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens read from the provider's cache
    cache_write_tokens: int = 0  # prompt tokens written to it (Anthropic)
    usd: float = 0.0  # uncached × input + cached × cached price + writes × write price + output × output price
    full_price_usd: float = 0.0  # the same tokens all at the input price (what a cache-blind ledger records)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def billed(usage: dict[str, Any] | None, teacher: TeacherConfig) -> Billed | None:
    """Settle a response ``usage``; None when it is unusable.

    OpenAI-style: ``prompt_tokens`` (all), ``prompt_tokens_details.cached_tokens`` (reads), per
    platform.openai.com/docs/guides/prompt-caching. Anthropic's native ``input_tokens`` (only what
    follows the last breakpoint), ``cache_read_input_tokens`` and ``cache_creation_input_tokens``
    (docs.anthropic.com prompt caching: total prompt = the three together) are read too, also when a
    gateway puts them into an OpenAI-shaped usage."""
    if not isinstance(usage, dict):
        return None
    c = _count(usage.get("completion_tokens", usage.get("output_tokens")))
    writes = _count(usage.get("cache_creation_input_tokens")) or 0
    if "prompt_tokens" in usage:
        p = _count(usage.get("prompt_tokens"))
        details = usage.get("prompt_tokens_details")
        reads = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
        if reads is None:
            reads = _count(usage.get("cache_read_input_tokens")) or 0
    else:  # native Anthropic usage
        inp = _count(usage.get("input_tokens"))
        reads = _count(usage.get("cache_read_input_tokens")) or 0
        p = None if inp is None else inp + reads + writes
    if p is None or c is None:
        return None
    reads, writes = min(reads, p), min(writes, max(0, p - reads))  # never more cached than sent
    uncached = p - reads - writes
    cost = (
        uncached * teacher.input_usd_per_mtok
        + reads * teacher.cached_price
        + writes * teacher.write_price
        + c * teacher.output_usd_per_mtok
    ) / 1e6
    return Billed(p, c, reads, writes, cost, usd(p, c, teacher))


def usage_cost(usage: dict[str, Any] | None, teacher: TeacherConfig) -> tuple[int | None, int | None, float | None]:
    """(prompt_tokens, completion_tokens, USD billed, cache reads and writes at their prices) from a
    response ``usage``; Nones when it is unusable."""
    b = billed(usage, teacher)
    if b is None:
        return None, None, None
    return b.prompt_tokens, b.completion_tokens, b.usd
