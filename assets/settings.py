"""Settings of the Dagster layer, read once from ``recipes/pipeline.yaml`` (+ env overrides).

In: the YAML file (path from ``COMPOSER_PIPELINE_RECIPE`` or the repo default). Out: a frozen
``PipelineSettings`` with absolute paths. Read through :mod:`composer_pipeline.settings`: unknown
keys are an error (a typo never falls back to a default), values are type-checked.
"""

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, overload

from assets.deployment import DeploymentSettings
from composer_pipeline import home, settings
from composer_pipeline.ingest.remote import DEFAULT_TRACE_ROOTS
from composer_pipeline.settings import setting
from resources.recipes import CHECKPOINTS_DIR, CheckThresholds

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RECIPE = REPO_ROOT / "recipes" / "pipeline.yaml"


@overload
def _abs(p: str) -> str: ...
@overload
def _abs(p: None) -> None: ...
def _abs(p: str | None) -> str | None:
    if p is None:
        return None
    if "://" in str(p):
        return str(p)
    path = Path(os.path.expanduser(str(p)))
    return str(path if path.is_absolute() else (REPO_ROOT / path).resolve())


@dataclass(frozen=True)
class TrainerRun:
    model: str | None = setting(
        None,
        help="base model dir / hub id of `trained_policy`; null: the train recipe's model ($COMPOSER_TRAIN_MODEL overrides)",
    )
    steps: int | None = setting(None, help="optimizer steps; null: the train recipe's optim.steps")


@dataclass(frozen=True)
class PipelineFile:
    """``recipes/pipeline.yaml`` as written (relative paths are relative to the repo root)."""

    MOVED: ClassVar[dict[str, str]] = {
        "schedule_cron": "recipes/train.yaml (schedule.cron)",
        "trace_root": "trace_roots (a list of roots; one root is a list of one)",
    }

    trace_roots: list[str] = setting(
        factory=lambda: list(DEFAULT_TRACE_ROOTS),
        help="where the sessions sensor scans for sessions: Claude Code's and Codex CLI's folders, or "
        "s3://bucket/prefix (what `sessions push` uploads; new/changed objects by ETag and size) "
        "($COMPOSER_TRACE_ROOT, one root, overrides)",
    )
    store_root: str = setting(
        ".store", help="Parquet tables: a local dir or s3://bucket/prefix ($COMPOSER_STORE overrides)"
    )
    ledger_path: str | None = setting(
        None,
        help="budget ledger: a file (embedded SQLite) or postgresql://...; null: the CLI's, "
        "$COMPOSER_PIPELINE_HOME/ledger.sqlite ($COMPOSER_LEDGER_URL overrides)",
    )
    cache_dir: str | None = setting(
        None, help="content-addressed teacher response cache; null: the CLI's, $COMPOSER_PIPELINE_HOME/teacher_cache"
    )
    checkpoints_dir: str = setting(CHECKPOINTS_DIR, help="trainer output before it is uploaded to the store")
    recipes: dict[str, str | None] = setting(
        factory=dict,
        help="stage recipes: ingest, teachers, pairs, normalize, train ($COMPOSER_TEACHERS_RECIPE overrides teachers)",
    )
    train: TrainerRun = setting(factory=TrainerRun, help="the trainer run by `trained_policy` (through Dagster Pipes)")
    sensor_interval_s: int = setting(60, help="how often the sessions sensor looks at trace_roots (seconds)")
    checks: CheckThresholds = setting(factory=CheckThresholds, help="asset check thresholds")
    deployment: DeploymentSettings = setting(
        factory=DeploymentSettings, help="where steps and the trainer run (docs/SCALING.md)"
    )


@dataclass(frozen=True, kw_only=True)
class PipelineSettings(PipelineFile):
    """What the Dagster layer uses: the same fields as :class:`PipelineFile` (declared once, there), with
    absolute paths, the environment overrides applied, and the ledger and cache defaults filled in."""

    # never None here: load_settings fills in the CLI's defaults (home.py)
    ledger_path: str
    cache_dir: str

    def recipe(self, name: str) -> str | None:
        """Absolute path of a stage recipe, or None when it does not exist (stage defaults apply)."""
        p = self.recipes.get(name)
        return p if p and ("://" in p or Path(p).exists()) else None


def load_settings(path: str | Path | None = None) -> PipelineSettings:
    path = Path(path or os.environ.get("COMPOSER_PIPELINE_RECIPE") or DEFAULT_RECIPE)
    raw = settings.read_yaml(path, "pipeline recipe") if path.exists() else {}
    f = settings.from_dict(PipelineFile, raw, str(path))
    recipes = {k: _abs(v) for k, v in f.recipes.items()}
    if os.environ.get("COMPOSER_TEACHERS_RECIPE"):
        recipes["teachers"] = _abs(os.environ["COMPOSER_TEACHERS_RECIPE"])
    return PipelineSettings(
        trace_roots=[
            _abs(r)
            for r in ([os.environ["COMPOSER_TRACE_ROOT"]] if os.environ.get("COMPOSER_TRACE_ROOT") else f.trace_roots)
        ],
        store_root=_abs(os.environ.get("COMPOSER_STORE") or f.store_root),
        ledger_path=_abs(home.default_ledger_url(f.ledger_path)),
        cache_dir=_abs(home.default_cache_dir(f.cache_dir)),
        checkpoints_dir=_abs(f.checkpoints_dir),
        recipes=recipes,
        train=dataclasses.replace(f.train, model=os.environ.get("COMPOSER_TRAIN_MODEL") or f.train.model),
        sensor_interval_s=f.sensor_interval_s,
        checks=f.checks,
        deployment=f.deployment.resolved(REPO_ROOT),
    )
