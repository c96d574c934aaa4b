"""Ingest recipe: the knobs of ``recipes/ingest.yaml`` as a typed settings dataclass.

In:  a YAML path, a dict, or ``None`` (defaults). Out: :class:`IngestRecipe`, read through
:mod:`composer_pipeline.settings` (unknown keys are an error: a typo must not silently fall back to
a default). The trace root is not here: the Dagster layer reads it from ``recipes/pipeline.yaml``
(``trace_root``) and the CLI takes paths.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from composer_pipeline import settings
from composer_pipeline.render import RenderOptions
from composer_pipeline.settings import setting

# auto: the compiled engine where built, else python
Engine = Literal["auto", "native", "python"]
ENGINES = typing.get_args(Engine)
# the agent whose sessions are read; auto: detected per file
Source = Literal["auto", "claude", "codex"]
SOURCES = typing.get_args(Source)


@dataclass
class IngestRecipe:
    MOVED: ClassVar[dict[str, str]] = {"trace_root": "recipes/pipeline.yaml (trace_root); the ingest CLI takes paths"}

    render: RenderOptions = setting(
        factory=RenderOptions, help="how a state's prefix is rendered for teachers and `show`"
    )
    extra_secret_patterns: dict[str, str] = setting(
        factory=dict, help="your own secret patterns, kind -> regex, scrubbed like the built-in ones"
    )
    drop_warmup: bool = setting(True, help='drop "Warmup" stub agents (counted in stats.warmup_dropped)')
    quarantine_text_chars: int = setting(
        2000, help="how much of an unparseable line the quarantine keeps (after scrubbing)"
    )
    engine: Engine = setting(
        "auto", help="auto (the compiled engine where built) | native | python (the reference); same output"
    )
    source: Source = setting(
        "auto", help="auto (each file's format detected) | claude (Claude Code sessions) | codex (Codex CLI rollouts)"
    )

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"ingest recipe: engine must be one of {', '.join(ENGINES)}, not {self.engine!r}")
        if self.source not in SOURCES:
            raise ValueError(f"ingest recipe: source must be one of {', '.join(SOURCES)}, not {self.source!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> IngestRecipe:
        return settings.from_dict(cls, d, "ingest recipe")

    @classmethod
    def load(cls, path: str | Path | None = None) -> IngestRecipe:
        if path is None:
            return cls()
        return settings.load(cls, path, "ingest recipe")
