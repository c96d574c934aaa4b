"""Stage recipes and check thresholds as one Dagster resource (shown, editable, in the UI).

In: ``assets.settings.PipelineSettings`` (recipes/pipeline.yaml). Out: recipe paths for each
stage (None -> the stage's built-in defaults), the trace root the sensor scans, the trainer's
base model/steps and the asset check thresholds.
"""

from __future__ import annotations

from typing import Optional

import dagster as dg

from assets.settings import CheckThresholds, PipelineFile

_CHECKS = CheckThresholds()  # the thresholds' defaults live there, once

class PipelineRecipes(dg.ConfigurableResource):
    trace_root: str
    ingest: Optional[str] = None
    pairs: Optional[str] = None
    normalize: Optional[str] = None
    train: Optional[str] = None
    train_model: Optional[str] = None
    train_steps: Optional[int] = None
    checkpoints_dir: str = PipelineFile().checkpoints_dir
    min_parse_success_ratio: float = _CHECKS.min_parse_success_ratio
    max_quarantine_rows: int = _CHECKS.max_quarantine_rows
    max_replay_error_rate: float = _CHECKS.max_replay_error_rate
    max_pair_drop_rate: float = _CHECKS.max_pair_drop_rate
    max_eval_regression: float = _CHECKS.max_eval_regression

    @classmethod
    def from_settings(cls, s) -> "PipelineRecipes":
        c = s.checks
        return cls(
            trace_root=s.trace_root,
            ingest=s.recipe("ingest"),
            pairs=s.recipe("pairs"),
            normalize=s.recipe("normalize"),
            train=s.recipe("train"),
            train_model=s.train_model,
            train_steps=s.train_steps,
            checkpoints_dir=s.checkpoints_dir,
            min_parse_success_ratio=c.min_parse_success_ratio,
            max_quarantine_rows=c.max_quarantine_rows,
            max_replay_error_rate=c.max_replay_error_rate,
            max_pair_drop_rate=c.max_pair_drop_rate,
            max_eval_regression=c.max_eval_regression,
        )
