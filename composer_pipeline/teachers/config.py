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

import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_REQUIRED = (
    "name",
    "base_url",
    "model",
    "api_key_env",
    "input_usd_per_mtok",
    "output_usd_per_mtok",
    "budget_usd",
    "max_concurrency",
)


@dataclass(frozen=True)
class TeacherConfig:
    name: str  # stable id: appears in call_id, the ledger and Parquet
    base_url: str  # OpenAI-compatible root, e.g. https://openrouter.ai/api/v1 (POST {base_url}/chat/completions)
    model: str  # the ``model`` field of the request
    api_key_env: str | None  # NAME of the env var holding the key; null for keyless local servers
    input_usd_per_mtok: float
    output_usd_per_mtok: float
    budget_usd: float  # lifetime budget, tracked in the ledger across runs and days
    max_concurrency: int = 4
    max_tokens: int = 512
    temperature: float = 0.0
    top_p: float | None = None
    seed: int | None = None
    timeout_s: float = 120.0  # per attempt (connect, read and write each)
    max_retries: int = 4  # extra attempts after the first, on 429 / 5xx / timeout / connection errors
    backoff_s: float = 1.0  # base of the exponential backoff (full jitter), capped at backoff_max_s
    backoff_max_s: float = 30.0

    def request_params(self) -> dict[str, Any]:
        """The sampling parameters sent with every request (part of the cache key)."""
        p: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": self.temperature}
        if self.top_p is not None:
            p["top_p"] = self.top_p
        if self.seed is not None:
            p["seed"] = self.seed
        return p

    @property
    def chat_url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"


@dataclass(frozen=True)
class TeachersConfig:
    teachers: list[TeacherConfig]
    ceiling_usd: float  # worst-case spend allowed in one replay run (all teachers together)
    serve: dict[str, str] = field(default_factory=dict)  # local server: model name -> path or known name
    source: str = ""
    lease_s: float = 30.0  # a replay run heartbeats; its open reservations are finalized this long after it dies
    max_invalid_responses: int = 3  # consecutive 200s that are not a chat completion (HTML, non-JSON) before a teacher is cut off

    def teacher(self, name: str) -> TeacherConfig:
        for t in self.teachers:
            if t.name == name:
                return t
        raise KeyError(f"no teacher {name!r} in {self.source or 'config'}")

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.teachers]


def _number(where: str, key: str, value: Any, *, positive: bool = False, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}: {key} must be a number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{where}: {key} must be {'> 0' if positive else '>= 0'}, got {value!r}")
    if integer and int(value) != value:
        raise ValueError(f"{where}: {key} must be an integer, got {value!r}")
    return int(value) if integer else float(value)


def _teacher(where: str, raw: Any) -> TeacherConfig:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: each teacher must be a mapping, got {type(raw).__name__}")
    known = {f.name for f in fields(TeacherConfig)}
    unknown = sorted(set(raw) - known)
    name = raw.get("name")
    where = f"{where} ({name})" if name else where
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(known)}")
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise ValueError(f"{where}: missing required key(s) {missing}")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise ValueError(f"{where}: name must be a non-empty [A-Za-z0-9_.-] string, got {name!r}")
    for k in ("base_url", "model"):
        if not isinstance(raw[k], str) or not raw[k]:
            raise ValueError(f"{where}: {k} must be a non-empty string")
    if not raw["base_url"].startswith(("http://", "https://")):
        raise ValueError(f"{where}: base_url must start with http:// or https://, got {raw['base_url']!r}")
    env = raw["api_key_env"]
    if env is not None and (not isinstance(env, str) or not _ENV_NAME_RE.match(env)):
        # never echo the value: it may be a pasted key
        raise ValueError(
            f"{where}: api_key_env must be the NAME of an environment variable (e.g. OPENROUTER_API_KEY) "
            "or null, not the key itself"
        )
    vals = dict(raw)
    for k in ("input_usd_per_mtok", "output_usd_per_mtok", "budget_usd", "temperature", "backoff_s", "backoff_max_s"):
        if k in vals:
            vals[k] = _number(where, k, vals[k])
    for k in ("max_concurrency", "max_tokens"):
        if k in vals:
            vals[k] = _number(where, k, vals[k], positive=True, integer=True)
    if "max_retries" in vals:
        vals["max_retries"] = _number(where, "max_retries", vals["max_retries"], integer=True)
    if "timeout_s" in vals:
        vals["timeout_s"] = _number(where, "timeout_s", vals["timeout_s"], positive=True)
    if vals.get("top_p") is not None:
        vals["top_p"] = _number(where, "top_p", vals["top_p"])
    if vals.get("seed") is not None:
        vals["seed"] = _number(where, "seed", vals["seed"], integer=True)
    return TeacherConfig(**vals)


def parse_teachers(data: Any, source: str = "<teachers>") -> TeachersConfig:
    """Validate an already-loaded mapping (what :func:`load_teachers` reads from YAML)."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: top level must be a mapping with 'ceiling_usd' and 'teachers'")
    top = ["ceiling_usd", "lease_s", "max_invalid_responses", "serve", "teachers"]
    unknown = sorted(set(data) - set(top))
    if unknown:
        raise ValueError(f"{source}: unknown top-level key(s) {unknown}; allowed: {top}")
    lease_s = _number(source, "lease_s", data.get("lease_s", 30.0), positive=True)
    if lease_s > 600:
        raise ValueError(f"{source}: lease_s must be <= 600 (a dead run's reservations are held that long), got {lease_s!r}")
    max_invalid = _number(source, "max_invalid_responses", data.get("max_invalid_responses", 3), positive=True, integer=True)
    if "ceiling_usd" not in data:
        raise ValueError(f"{source}: missing required top-level key 'ceiling_usd' (cap on one replay run)")
    ceiling = _number(source, "ceiling_usd", data["ceiling_usd"])
    raw_teachers = data.get("teachers")
    if not isinstance(raw_teachers, list) or not raw_teachers:
        raise ValueError(f"{source}: 'teachers' must be a non-empty list")
    teachers = [_teacher(f"{source}: teachers[{i}]", t) for i, t in enumerate(raw_teachers)]
    names = [t.name for t in teachers]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"{source}: duplicate teacher name(s) {dupes}")
    serve = data.get("serve") or {}
    if not isinstance(serve, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in serve.items()):
        raise ValueError(f"{source}: 'serve' must map model names to paths or known model names")
    return TeachersConfig(teachers=teachers, ceiling_usd=ceiling, serve=dict(serve), source=source, lease_s=lease_s,
                          max_invalid_responses=int(max_invalid))


def load_teachers(path: str | Path) -> TeachersConfig:
    """Load and validate a teachers YAML file; a clear ``ValueError`` on any problem."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"teachers config not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    return parse_teachers(data, str(path))
