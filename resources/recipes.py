"""Stage recipes and check thresholds as one Dagster resource (shown, editable, in the UI).

In: ``assets.settings.PipelineSettings`` (recipes/pipeline.yaml). Out: recipe paths for each
stage (None -> the stage's built-in defaults), the trace root the sensor scans, the trainer's
base model/steps and the asset check thresholds.

The thresholds are declared once, in :class:`CheckThresholds` (here, below the Dagster assets that
read the settings file: ``resources/`` never imports ``assets/``); the resource's fields of the same
names take their defaults from it, and ``tests/test_settings.py`` checks that the two stay one set.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import dagster as dg

from composer_pipeline.settings import setting

# trainer output before it is uploaded to the store (pipeline.yaml's default)
CHECKPOINTS_DIR = ".state/checkpoints"


@dataclass(frozen=True)
class CheckThresholds:
    """Asset check thresholds (the ``checks`` section of recipes/pipeline.yaml)."""

    min_parse_success_ratio: float = setting(0.95, help="parsed lines / all lines, per session")
    max_quarantine_rows: int = setting(1000, help="quarantined lines per session")
    max_replay_error_rate: float = setting(0.25, help="failed / all teacher calls, per session")
    max_pair_drop_rate: float = setting(0.95, help="dropped / (kept + dropped) in normalization, per session")
    max_eval_regression: float = setting(0.05, help="allowed drop of the new policy's score vs the starting model")


_CHECKS = CheckThresholds()


class PipelineRecipes(dg.ConfigurableResource):
    # the roots the sensor scans and partitions are found under (recipes/pipeline.yaml ``trace_roots``);
    # ``trace_root``: one root, for a resource built by hand (both given: the list, then it)
    trace_roots: list[str] = []
    trace_root: str = ""
    ingest: str | None = None
    pairs: str | None = None
    normalize: str | None = None
    train: str | None = None
    train_model: str | None = None
    train_steps: int | None = None
    checkpoints_dir: str = CHECKPOINTS_DIR
    min_parse_success_ratio: float = _CHECKS.min_parse_success_ratio
    max_quarantine_rows: int = _CHECKS.max_quarantine_rows
    max_replay_error_rate: float = _CHECKS.max_replay_error_rate
    max_pair_drop_rate: float = _CHECKS.max_pair_drop_rate
    max_eval_regression: float = _CHECKS.max_eval_regression

    @classmethod
    def from_settings(cls, s) -> PipelineRecipes:
        return cls(
            trace_roots=list(s.trace_roots),
            ingest=s.recipe("ingest"),
            pairs=s.recipe("pairs"),
            normalize=s.recipe("normalize"),
            train=s.recipe("train"),
            train_model=s.train.model,
            train_steps=s.train.steps,
            checkpoints_dir=s.checkpoints_dir,
            **dataclasses.asdict(s.checks),
        )

    def roots(self) -> list[str]:
        """Every trace root, in order (a session key found under two roots is the first root's)."""
        return [*self.trace_roots, *([self.trace_root] if self.trace_root else [])]
