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
spent. With ``max_tokens`` always sent, the worst case bounds what an honest provider can bill: a
usage beyond it is clamped to the reservation and flagged (:func:`settle`), never recorded at what
it claims.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import orjson

from composer_pipeline.teachers.config import TeacherConfig

# no token covers less than one byte (see module docstring)
BYTES_PER_TOKEN = 1.0
# role markers, separators, tool-call framing of chat templates
TOKENS_PER_MESSAGE = 8
# generation prompt, BOS, tool-list framing
TOKENS_FIXED = 32


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


def max_completion_tokens(body: dict[str, Any], teacher: TeacherConfig) -> int:
    """The completion tokens a request allows (``max_tokens``, or ``max_completion_tokens`` for OpenAI's
    reasoning models): the most an honest provider bills as output."""
    return int(body.get("max_tokens") or body.get("max_completion_tokens") or teacher.max_tokens)


def worst_case_usd(body: dict[str, Any], teacher: TeacherConfig, n_bytes: int | None = None) -> tuple[int, float]:
    """(estimated prompt tokens, worst-case cost = estimate × input price + max_tokens × output price)."""
    est = estimate_prompt_tokens(body, n_bytes)
    return est, usd(est, max_completion_tokens(body, teacher), teacher)


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


# every token count a usage may carry (OpenAI-style and native Anthropic); each must be a count when present
_COUNT_FIELDS = (
    "prompt_tokens",
    "completion_tokens",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "prompt_tokens_details.cached_tokens",
    "cache_creation.ephemeral_5m_input_tokens",
    "cache_creation.ephemeral_1h_input_tokens",
)


def usage_problem(usage: dict[str, Any]) -> str | None:
    """None when every token count ``usage`` carries is a non-negative integer, else the first one that is not
    (a negative count would hide inside a sum and under-record the cost; a float or a string is no count)."""
    for name in _COUNT_FIELDS:
        outer, _, inner = name.partition(".")
        v = usage.get(outer)
        if inner:
            v = v.get(inner) if isinstance(v, dict) else None
        if v is not None and _count(v) is None:
            return f"{name} = {str(v)[:40]}"
    return None


@dataclass(frozen=True)
class Billed:
    """What a provider's ``usage`` says was billed, split by price: ``prompt_tokens`` counts all of them
    (uncached + cached reads + cache writes)."""

    prompt_tokens: int
    completion_tokens: int
    # prompt tokens read from the provider's cache
    cached_tokens: int = 0
    # prompt tokens written to it (Anthropic), of which
    cache_write_tokens: int = 0
    # one-hour writes (Anthropic ``ttl: "1h"``, 2× the input price)
    cache_write_1h_tokens: int = 0
    # uncached × input + cached × cached price + writes × write price + output × output price
    usd: float = 0.0
    # the same tokens all at the input price (what a cache-blind ledger records)
    full_price_usd: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def usage(self) -> dict[str, Any]:
        """These counts as an OpenAI-shaped ``usage`` (what a cached answer carries once settled)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
            "cache_creation_input_tokens": self.cache_write_tokens,
            "cache_creation": {"ephemeral_1h_input_tokens": self.cache_write_1h_tokens},
        }


# a one-hour cache write costs 2× the input price (docs.anthropic.com prompt caching)
ONE_HOUR_WRITE_FACTOR = 2.0


def price(prompt: int, completion: int, reads: int, writes: int, writes_1h: int, teacher: TeacherConfig) -> Billed:
    """The counts at the teacher's prices; reads and writes never exceed the prompt they are part of."""
    reads = min(reads, prompt)
    writes = min(writes, prompt - reads)
    writes_1h = min(writes_1h, writes)
    cost = (
        (prompt - reads - writes) * teacher.input_usd_per_mtok
        + reads * teacher.cached_price
        + (writes - writes_1h) * teacher.write_price
        + writes_1h * teacher.input_usd_per_mtok * ONE_HOUR_WRITE_FACTOR
        + completion * teacher.output_usd_per_mtok
    ) / 1e6
    return Billed(prompt, completion, reads, writes, writes_1h, cost, usd(prompt, completion, teacher))


def billed(usage: dict[str, Any] | None, teacher: TeacherConfig) -> Billed | None:
    """Settle a response ``usage`` as reported; None when it is unusable (missing or not counts).

    OpenAI-style: ``prompt_tokens`` (all), ``prompt_tokens_details.cached_tokens`` (reads), per
    platform.openai.com/docs/guides/prompt-caching. Anthropic's native ``input_tokens`` (only what
    follows the last breakpoint), ``cache_read_input_tokens`` and ``cache_creation_input_tokens``
    (docs.anthropic.com prompt caching: total prompt = the three together; of the writes,
    ``cache_creation.ephemeral_1h_input_tokens`` at 2× input) are read too, also when a gateway puts them
    into an OpenAI-shaped usage. What a request can honestly be billed is :func:`settle`'s."""
    if not isinstance(usage, dict) or usage_problem(usage) is not None:
        return None
    c = _count(usage.get("completion_tokens", usage.get("output_tokens")))
    writes = _count(usage.get("cache_creation_input_tokens")) or 0
    creation = usage.get("cache_creation")
    writes_1h = (_count(creation.get("ephemeral_1h_input_tokens")) or 0) if isinstance(creation, dict) else 0
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
    return price(p, c, reads, writes, writes_1h, teacher)


def usage_cost(usage: dict[str, Any] | None, teacher: TeacherConfig) -> tuple[int | None, int | None, float | None]:
    """(prompt_tokens, completion_tokens, USD billed, cache reads and writes at their prices) from a
    response ``usage``; Nones when it is unusable."""
    b = billed(usage, teacher)
    if b is None:
        return None, None, None
    return b.prompt_tokens, b.completion_tokens, b.usd


@dataclass(frozen=True)
class Settlement:
    """What the ledger records for one answer: ``cost_usd`` never above the reservation, ``billed`` the counts
    it stands for (None: usage missing or not counts, settled at the reservation), ``flag`` why it is not
    simply the provider's usage, ``claimed_usd`` what the provider's usage would have cost."""

    cost_usd: float
    billed: Billed | None
    flag: str | None = None
    claimed_usd: float | None = None

    @property
    def excess_usd(self) -> float:
        return max(0.0, (self.claimed_usd or 0.0) - self.cost_usd)


def settle(
    usage: Any, teacher: TeacherConfig, *, prompt_bound: int, completion_bound: int, reserved_usd: float
) -> Settlement:
    """Settle ``usage`` within what the request could honestly be billed.

    An honest provider bills no more output than ``max_tokens`` (``completion_bound``) and no more prompt than
    the request holds (``prompt_bound``, :func:`estimate_prompt_tokens`, an upper bound), so no more than the
    reservation made for it. A usage beyond that is clamped to those bounds and to the reservation, and flagged
    ``usage_over_bound`` with the claim and the excess; a usage with a negative, fractional or non-numeric
    count is ``usage_invalid`` and settles at the reservation (worst case); a missing one is ``no_usage``, also
    at the worst case. One answer never spends more than its own reservation: another teacher's budget or the
    run's ceiling are never touched by a provider's numbers."""
    if not isinstance(usage, dict):
        return Settlement(reserved_usd, None, "no_usage: worst case charged")
    problem = usage_problem(usage)
    if problem is not None:
        return Settlement(
            reserved_usd, None, f"usage_invalid: {problem}; settled at the reservation ${reserved_usd:.6g}"
        )
    b = billed(usage, teacher)
    if b is None:
        return Settlement(reserved_usd, None, "no_usage: worst case charged")
    over = []
    if b.prompt_tokens > prompt_bound:
        over.append(f"prompt_tokens {b.prompt_tokens} > {prompt_bound} sent")
    if b.completion_tokens > completion_bound:
        over.append(f"completion_tokens {b.completion_tokens} > max_tokens {completion_bound}")
    if not over and b.usd <= reserved_usd:
        return Settlement(b.usd, b, None, b.usd)
    p, c = min(b.prompt_tokens, prompt_bound), min(b.completion_tokens, completion_bound)
    reads = min(b.cached_tokens, p)
    kept = price(p, c, reads, min(b.cache_write_tokens, p - reads), b.cache_write_1h_tokens, teacher)
    cost = min(kept.usd, reserved_usd)
    kept = dataclasses.replace(kept, usd=cost)
    what = "; ".join(over) or f"${b.usd:.6g} > reservation ${reserved_usd:.6g}"
    flag = f"usage_over_bound: {what}; claimed ${b.usd:.6g}, settled ${cost:.6g} (excess ${b.usd - cost:.6g})"
    return Settlement(cost, kept, flag, b.usd)
