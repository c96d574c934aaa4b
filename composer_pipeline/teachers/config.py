"""Teacher configuration: ``recipes/teachers.yaml`` → typed :class:`TeachersConfig`.

In:  a YAML file with a top-level ``ceiling_usd`` (cap on one replay run = one partition), a
     ``teachers`` list and optionally ``serve`` (local models the demo server should host).
Out: :class:`TeachersConfig` with one :class:`TeacherConfig` per teacher.

Every teacher names the *environment variable* holding its API key (``api_key_env``), never the key:
the key is read by the caller (CLI: ``os.environ``; Dagster: ``dg.EnvVar``) and passed to the client as
a value. Unknown keys, missing prices/budgets and values that look like a literal key are a
``ValueError`` at load time, naming the file, the teacher and the key.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit, urlunsplit

from composer_pipeline import settings
from composer_pipeline.settings import derived, setting

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _at_least(obj: Any, keys: tuple[str, ...], *, positive: bool = False) -> None:
    for k in keys:
        v = getattr(obj, k)
        if v is not None and (v < 0 or (positive and v == 0)):
            raise ValueError(f"{k} must be {'> 0' if positive else '>= 0'}, got {v!r}")


# Anthropic's API version 2026-10-21 (released that day; the official SDKs' majors send it) removed
# temperature, top_p and top_k: a request carrying any of them is a 400, even at the default value
# (platform.claude.com/docs/en/api/versioning, "Migrating to API version 2026-10-21")
ANTHROPIC_NO_SAMPLING_FROM = "2026-10-21"
# the temperature range each protocol accepts (docs.anthropic.com Messages: 0-1; platform.openai.com chat: 0-2)
TEMPERATURE_MAX = {"anthropic": 1.0, "openai": 2.0}
# OpenAI reasoning-model families (o1, o3, o4-mini, gpt-5...): ``max_tokens`` is an unsupported_parameter there,
# ``max_completion_tokens`` is what they take (platform.openai.com/docs/guides/reasoning)
REASONING_MODEL_RE = re.compile(r"(o\d+|gpt-5)([-.:_].*)?$", re.I)


def split_user_info(url: str) -> tuple[str, tuple[str, str] | None]:
    """``url`` without its user info, and the (user, password) it held (percent-decoded), or None."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    info, _, host = parts.netloc.rpartition("@")
    user, _, password = info.partition(":")
    return urlunsplit(parts._replace(netloc=host)), (unquote(user), unquote(password))


@dataclass(frozen=True)
class TeacherConfig:
    """One entry of ``teachers:``: an OpenAI-compatible endpoint + model, its prices, budget and request params."""

    name: str = setting(help="stable id: appears in call_id, the ledger and Parquet ([A-Za-z0-9_.-])")
    base_url: str = setting(
        help="OpenAI-compatible root, e.g. https://openrouter.ai/api/v1 (POST {base_url}/chat/completions); api: anthropic: https://api.anthropic.com. "
        "User info (http://user:password@host/v1, basic auth in front of a server) is sent as basic auth and kept out of every stored form of the URL"
    )
    model: str = setting(help="the `model` field of the request")
    api_key_env: str | None = setting(
        help="NAME of the environment variable holding the key (never the key); null for keyless local servers"
    )
    input_usd_per_mtok: float = setting(help="price per million input tokens, USD")
    output_usd_per_mtok: float = setting(help="price per million output tokens, USD")
    budget_usd: float = setting(
        help="lifetime budget, tracked in the ledger across runs and days (0 with zero prices: free)"
    )
    max_concurrency: int = setting(help="requests in flight at once to this teacher")
    max_tokens: int = setting(512, help="completion tokens per request (the worst case the budget reserves)")
    temperature: float | None = setting(
        None,
        help="0: greedy (entries of one model at 0 count as one vote); > 0: samples of the model; null: not sent "
        "(the model's default; newer Claude and OpenAI reasoning models refuse it). anthropic: 0-1, openai: 0-2",
    )
    top_p: float | None = setting(None, help="nucleus sampling, sent only when set")
    seed: int | None = setting(
        None, help="sampling seed, sent only when set (entries sampling one model need distinct seeds)"
    )
    timeout_s: float = setting(120.0, help="per attempt (connect, read and write each)")
    max_retries: int = setting(4, help="extra attempts after the first, on 429 / 5xx / timeout / connection errors")
    backoff_s: float = setting(1.0, help="base of the exponential backoff (full jitter), capped at backoff_max_s")
    backoff_max_s: float = setting(30.0, help="cap of one backoff wait")
    api: Literal["openai", "anthropic"] = setting(
        "openai",
        help="wire protocol: openai (POST {base_url}/chat/completions) or anthropic (native Messages API, "
        "POST {base_url}/v1/messages, with cache_control breakpoints)",
    )
    cached_input_usd_per_mtok: float | None = setting(
        None,
        help="price per million prompt tokens the provider reports as cached (read); null: the input price (no discount)",
    )
    cache_write_usd_per_mtok: float | None = setting(
        None,
        help="price per million prompt tokens written to the cache (Anthropic: 1.25x input); null: the input price",
    )
    prompt_cache_key: bool = setting(
        True,
        help="openai: send prompt_cache_key = a hash of the stream (raises the hit rate); false for servers that refuse unknown fields",
    )
    context_window: int | None = setting(
        None,
        help="the teacher's window in tokens (prompt + max_tokens); longer prefixes are fitted (render.fit_messages); null: no limit",
    )
    anthropic_version: str = setting(
        "2026-10-21",
        help="anthropic: the anthropic-version header: 2026-10-21, the current version (no temperature/top_p there); "
        "2023-06-01, the earlier one, still takes them and is listed as deprecated for new users",
    )
    batch_price_factor: float = setting(
        0.5,
        help="mode: batch: the share of this teacher's prices its batch API bills (OpenAI and Anthropic: 0.5), in (0, 1]",
    )
    fit_elide_step: int = setting(
        8,
        help="fitting elides turns in multiples of this many, so consecutive states share a prefix the provider can cache (1: keep every turn that fits)",
    )

    # (user, password) from base_url's user info, which base_url itself then no longer holds (never shown)
    basic_auth: tuple[str, str] | None = dataclasses.field(
        default=None, repr=False, compare=False, metadata={"derived": True}
    )

    def __post_init__(self) -> None:
        url, auth = split_user_info(self.base_url)
        if auth is not None:
            # (frozen) identity, call ids, cache records, logs
            object.__setattr__(self, "base_url", url)
            object.__setattr__(self, "basic_auth", auth)
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+", self.name):
            raise ValueError(f"name must be a non-empty [A-Za-z0-9_.-] string, got {self.name!r}")
        for k in ("base_url", "model"):
            if not getattr(self, k):
                raise ValueError(f"{k} must be a non-empty string")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        if self.api_key_env is not None and not _ENV_NAME_RE.match(self.api_key_env):
            # never echo the value: it may be a pasted key
            raise ValueError(
                "api_key_env must be the NAME of an environment variable (e.g. OPENROUTER_API_KEY) or null, not the key itself"
            )
        _at_least(
            self,
            (
                "input_usd_per_mtok",
                "output_usd_per_mtok",
                "budget_usd",
                "temperature",
                "top_p",
                "seed",
                "max_retries",
                "backoff_s",
                "backoff_max_s",
            ),
        )
        _at_least(self, ("max_concurrency", "max_tokens", "timeout_s", "fit_elide_step"), positive=True)
        _at_least(self, ("cached_input_usd_per_mtok", "cache_write_usd_per_mtok"))
        if self.api not in ("openai", "anthropic"):
            raise ValueError(f"api must be 'openai' or 'anthropic', got {self.api!r}")
        if not 0 < self.batch_price_factor <= 1:
            raise ValueError(f"batch_price_factor must be in (0, 1], got {self.batch_price_factor!r}")
        if self.api == "anthropic" and self.anthropic_version >= ANTHROPIC_NO_SAMPLING_FROM:
            set_ = [k for k in ("temperature", "top_p") if getattr(self, k) is not None]
            if set_:
                raise ValueError(
                    f"{' and '.join(set_)} cannot be sent with anthropic_version {self.anthropic_version} (removed "
                    f"there: a 400 even at the default); leave {'them' if len(set_) > 1 else 'it'} out, or set "
                    "anthropic_version: 2023-06-01 (deprecated for new users) to sample at a set temperature"
                )
        top = TEMPERATURE_MAX[self.api]
        if self.temperature is not None and self.temperature > top:
            raise ValueError(f"temperature must be in [0, {top:g}] for api: {self.api}, got {self.temperature!r}")
        if self.cached_input_usd_per_mtok is not None and self.cached_input_usd_per_mtok > self.input_usd_per_mtok:
            raise ValueError(
                f"cached_input_usd_per_mtok {self.cached_input_usd_per_mtok:g} is above input_usd_per_mtok "
                f"{self.input_usd_per_mtok:g} (a cached prompt token never costs more than an uncached one)"
            )
        if self.context_window is not None:
            from composer_pipeline.render import min_window

            need = min_window(self.max_tokens)
            if self.context_window < need:
                raise ValueError(
                    f"context_window {self.context_window} is too small for the system prompt plus one turn "
                    f"and max_tokens {self.max_tokens} (needs at least {need} tokens)"
                )

    def request_params(self) -> dict[str, Any]:
        """The sampling parameters sent with every request (part of the cache key)."""
        p: dict[str, Any] = {self.max_tokens_param: self.max_tokens}
        if self.temperature is not None:
            p["temperature"] = self.temperature
        if self.top_p is not None:
            p["top_p"] = self.top_p
        if self.seed is not None:
            p["seed"] = self.seed
        return p

    @property
    def max_tokens_param(self) -> str:
        """``max_completion_tokens`` for OpenAI's reasoning models (they refuse ``max_tokens``), else ``max_tokens``."""
        reasoning = self.api == "openai" and REASONING_MODEL_RE.match(self.model.rsplit("/", 1)[-1])
        return "max_completion_tokens" if reasoning else "max_tokens"

    @property
    def chat_url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    def identity(self) -> dict[str, Any]:
        """Who this name stands for on a ledger: endpoint, model and prices (the budget is not identity: it may
        be raised). ``call_id`` carries ``base_url`` and ``model``; the ledger refuses the name for another identity."""
        return {
            "base_url": self.base_url.rstrip("/"),
            "model": self.model,
            "api": self.api,
            "input_usd_per_mtok": float(self.input_usd_per_mtok),
            "output_usd_per_mtok": float(self.output_usd_per_mtok),
            "cached_input_usd_per_mtok": float(self.cached_price),
            "cache_write_usd_per_mtok": float(self.write_price),
        }

    @property
    def request_url(self) -> str:
        """Where requests go: the chat-completions URL, or for ``api: anthropic`` the Messages API URL."""
        if self.api == "anthropic":
            base = self.base_url.rstrip("/")
            return base + ("/messages" if base.endswith("/v1") else "/v1/messages")
        return self.chat_url

    @property
    def cached_price(self) -> float:
        return self.input_usd_per_mtok if self.cached_input_usd_per_mtok is None else self.cached_input_usd_per_mtok

    @property
    def write_price(self) -> float:
        return self.input_usd_per_mtok if self.cache_write_usd_per_mtok is None else self.cache_write_usd_per_mtok


@dataclass(frozen=True)
class TeachersConfig:
    """``recipes/teachers.yaml``: the teachers, the run ceiling, the local server's models, lease and cut-off."""

    teachers: list[TeacherConfig] = setting(help="the teacher entries (a non-empty list, unique names)")
    ceiling_usd: float = setting(
        help="worst-case spend allowed in one replay run (one partition), all teachers together"
    )
    serve: dict[str, str] = setting(factory=dict, help="local teacher server: model name -> path or known model name")
    source: str = derived("")  # the file it was read from
    lease_s: float = setting(
        30.0,
        help="a replay run heartbeats; its open reservations are finalized this long after it dies (0 < lease_s <= 600)",
    )
    max_invalid_responses: int = setting(
        3, help="consecutive 200s that are not a chat completion (HTML, non-JSON) before a teacher is cut off"
    )
    ledger_outage_s: float = setting(
        120.0,
        help="a ledger server lost mid-run (restart, failover) is retried this long, then the run stops with an error (> 0)",
    )
    scheduling: Literal["stream", "all"] = setting(
        "stream",
        help="stream: the states of one stream go to a teacher in order (each request extends the previous "
        "one's prefix, so it reads the cache that one wrote), streams in parallel up to max_concurrency; all: every call at once",
    )
    escalation: list[list[str]] = setting(
        factory=list,
        help="cheap teachers first: tiers of teacher names, e.g. [[cheap-a, cheap-b], [strong-a]] (every teacher in "
        "exactly one tier); a state goes to the next tier only while the answers so far could still make a pair "
        "(they disagree with the agent or with each other, pairs/build.py pair_ruled_out); empty: every teacher at once",
    )

    mode: Literal["sync", "batch"] = setting(
        "sync",
        help="sync: one request per call, answered now; batch: each teacher's outstanding calls go out as provider "
        "batches (OpenAI Batch, Anthropic Message Batches) at batch_price_factor of the price, answered within 24 h "
        "(replay --mode batch; --no-wait returns after submission, a later run with the same arguments collects)",
    )
    poll_batches_s: float = setting(30.0, help="mode: batch: seconds between two reads of a live batch's status (> 0)")

    def __post_init__(self) -> None:
        if not self.teachers:
            raise ValueError("'teachers' must be a non-empty list")
        names = [t.name for t in self.teachers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate teacher name(s) {dupes}")
        _at_least(self, ("ceiling_usd",))
        _at_least(self, ("lease_s", "max_invalid_responses", "ledger_outage_s", "poll_batches_s"), positive=True)
        self._check_escalation(names)
        if self.escalation and self.mode == "batch":
            raise ValueError(
                "escalation and mode: batch do not combine yet (a batch answers every tier at once, which is what "
                "escalation avoids): drop one of them"
            )
        if self.lease_s > 600:
            raise ValueError(
                f"lease_s must be <= 600 (a dead run's reservations are held that long), got {self.lease_s!r}"
            )

    def _check_escalation(self, names: list[str]) -> None:
        if not self.escalation:
            return
        listed = [n for tier in self.escalation for n in tier]
        problems = []
        if any(not tier for tier in self.escalation):
            problems.append("a tier is empty")
        unknown = sorted({n for n in listed if n not in names})
        if unknown:
            problems.append(f"{unknown} are not teachers")
        twice = sorted({n for n in listed if listed.count(n) > 1})
        if twice:
            problems.append(f"{twice} appear more than once")
        missing = [n for n in names if n not in listed]
        if missing:
            problems.append(f"teachers {missing} are in no tier (list every teacher once)")
        if problems:
            raise ValueError("escalation: " + "; ".join(problems))

    def tier_of(self, name: str) -> int:
        """The escalation tier (0 first) of a teacher; 0 for every teacher without ``escalation``."""
        for k, tier in enumerate(self.escalation):
            if name in tier:
                return k
        return 0

    def teacher(self, name: str) -> TeacherConfig:
        for t in self.teachers:
            if t.name == name:
                return t
        raise KeyError(f"no teacher {name!r} in {self.source or 'config'}")

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.teachers]

    def identities(self) -> dict[str, dict[str, Any]]:
        return {t.name: t.identity() for t in self.teachers}


def clean_api_key(value: str | None, env_name: str) -> str | None:
    """An API key as found in its variable, without the surrounding whitespace a copy-paste adds (a trailing
    newline, CR, tab or space: HTTP refuses such a header, or the provider rejects the key). A key with a
    control character or a non-ASCII character inside cannot travel in a header: ``ValueError`` naming the
    variable (never the value), before anything is reserved or sent. Empty after stripping: ``None``."""
    if value is None:
        return None
    key = value.strip()
    bad = [c for c in key if ord(c) < 0x21 or ord(c) > 0x7E]
    if bad:
        kind = (
            "a control character"
            if any(ord(c) < 0x20 or ord(c) == 0x7F for c in bad)
            else "whitespace"
            if any(c.isspace() for c in bad)
            else "a non-ASCII character"
        )
        raise ValueError(
            f"environment variable {env_name}: the API key contains {kind} inside it; set it to the key alone"
        )
    return key or None


def clean_api_keys(config: TeachersConfig, api_keys: Mapping[str, str | None]) -> dict[str, str | None]:
    """:func:`clean_api_key` for every teacher's key (teacher name -> value)."""
    return {
        name: clean_api_key(v, next((t.api_key_env or name for t in config.teachers if t.name == name), name))
        for name, v in api_keys.items()
    }


def parse_teachers(data: Any, source: str = "<teachers>") -> TeachersConfig:
    """Validate an already-loaded mapping (what :func:`load_teachers` reads from YAML)."""
    return dataclasses.replace(settings.from_dict(TeachersConfig, data, source), source=source)


def load_teachers(path: str | Path) -> TeachersConfig:
    """Load and validate a teachers YAML file; a clear ``ValueError`` on any problem."""
    return parse_teachers(settings.read_yaml(path, "teachers config"), str(path))
