"""Ingest recipe: the knobs of ``recipes/ingest.yaml`` as a typed dataclass.

In:  a YAML path, a dict, or ``None`` (defaults). Out: :class:`IngestRecipe`.
Unknown keys are an error (a typo must not silently fall back to a default).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from composer_pipeline.render import RenderOptions

ENGINES = ("auto", "native", "python")  # auto: the compiled engine where built, else python


@dataclass
class IngestRecipe:
    trace_root: str = "~/.claude/projects"  # where the Dagster sensor looks for sessions
    render: RenderOptions = field(default_factory=RenderOptions)
    extra_secret_patterns: dict[str, str] = field(default_factory=dict)  # kind -> regex
    drop_warmup: bool = True  # drop "Warmup" stub agents (counted in stats.warmup_dropped)
    quarantine_text_chars: int = 2000  # how much of a bad line the quarantine keeps
    engine: str = "auto"  # auto (native when built) | native | python (the reference); same output

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"ingest recipe: engine must be one of {', '.join(ENGINES)}, not {self.engine!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "IngestRecipe":
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"ingest recipe: unknown keys {unknown} (known: {sorted(known)})")
        render = RenderOptions.from_recipe(d.pop("render", None) or {})
        extra = d.pop("extra_secret_patterns", None) or {}
        if not isinstance(extra, dict):
            raise ValueError("ingest recipe: extra_secret_patterns must be a mapping kind -> regex")
        return cls(render=render, extra_secret_patterns={str(k): str(v) for k, v in extra.items()}, **d)

    @classmethod
    def load(cls, path: str | Path | None = None) -> "IngestRecipe":
        if path is None:
            return cls()
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"ingest recipe not found: {p}")
        import yaml  # only here: a run on the defaults skips its import (~15 ms of every CLI start)

        data = yaml.safe_load(p.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"ingest recipe {p}: top level must be a mapping")
        return cls.from_dict(data)
