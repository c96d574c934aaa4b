"""Settings of the Dagster layer, read once from ``recipes/pipeline.yaml`` (+ env overrides).

In: the YAML file (path from ``COMPOSER_PIPELINE_RECIPE`` or the repo default). Out: a frozen
``PipelineSettings`` with absolute paths. Simplified: no schema library; unknown keys are an error
so a typo in the recipe does not silently fall back to a default.
"""

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from assets.deployment import DeploymentSettings

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RECIPE = REPO_ROOT / "recipes" / "pipeline.yaml"
_KEYS = {
    "trace_root", "store_root", "ledger_path", "cache_dir", "checkpoints_dir", "recipes",
    "train", "sensor_interval_s", "schedule_cron", "checks", "deployment",
}


def _abs(p: str | None) -> str | None:
    if p is None:
        return None
    if "://" in str(p):
        return str(p)
    path = Path(os.path.expanduser(str(p)))
    return str(path if path.is_absolute() else (REPO_ROOT / path).resolve())


@dataclass(frozen=True)
class CheckThresholds:
    min_parse_success_ratio: float = 0.95
    max_quarantine_rows: int = 1000
    max_replay_error_rate: float = 0.25
    max_pair_drop_rate: float = 0.95
    max_eval_regression: float = 0.05


@dataclass(frozen=True)
class PipelineSettings:
    trace_root: str
    store_root: str
    ledger_path: str
    cache_dir: str
    checkpoints_dir: str
    recipes: dict[str, str | None] = field(default_factory=dict)
    train_model: str | None = None
    train_steps: int | None = None
    sensor_interval_s: int = 60
    schedule_cron: str | None = None
    checks: CheckThresholds = CheckThresholds()
    # where steps and the trainer run (docs/SCALING.md); defaults: in-process executor, local subprocess
    deployment: DeploymentSettings = DeploymentSettings()

    def recipe(self, name: str) -> str | None:
        """Absolute path of a stage recipe, or None when it does not exist (stage defaults apply)."""
        p = self.recipes.get(name)
        return p if p and ("://" in p or Path(p).exists()) else None


def load_settings(path: str | Path | None = None) -> PipelineSettings:
    path = Path(path or os.environ.get("COMPOSER_PIPELINE_RECIPE") or DEFAULT_RECIPE)
    raw = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    unknown = set(raw) - _KEYS
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}")
    recipes = {k: _abs(v) for k, v in (raw.get("recipes") or {}).items()}
    if os.environ.get("COMPOSER_TEACHERS_RECIPE"):
        recipes["teachers"] = _abs(os.environ["COMPOSER_TEACHERS_RECIPE"])
    train = raw.get("train") or {}
    return PipelineSettings(
        trace_root=_abs(os.environ.get("COMPOSER_TRACE_ROOT") or raw.get("trace_root") or "~/.claude/projects"),
        store_root=_abs(os.environ.get("COMPOSER_STORE") or raw.get("store_root") or ".store"),
        ledger_path=_abs(os.environ.get("COMPOSER_LEDGER_URL") or raw.get("ledger_path") or ".state/ledger.sqlite"),
        cache_dir=_abs(raw.get("cache_dir") or ".state/teacher_cache"),
        checkpoints_dir=_abs(raw.get("checkpoints_dir") or ".state/checkpoints"),
        recipes=recipes,
        train_model=os.environ.get("COMPOSER_TRAIN_MODEL") or train.get("model"),
        train_steps=train.get("steps"),
        sensor_interval_s=int(raw.get("sensor_interval_s") or 60),
        schedule_cron=raw.get("schedule_cron"),
        checks=CheckThresholds(**(raw.get("checks") or {})),
        deployment=DeploymentSettings.from_dict(raw.get("deployment"), REPO_ROOT),
    )
