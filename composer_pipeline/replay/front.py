"""The replay front end: the one sequence ``composer-pipeline replay`` and the replay assets both run.

In:  ``trace_states`` + ``trace_messages``, a :class:`TeachersConfig`, render options, a response cache, a
     ledger, API keys as values, a run id.
Out: :class:`ReplayFront`'s steps, in order:

1. :meth:`~ReplayFront.prepare` → a :class:`ReplayRun` (every state × teacher request, built once);
   :meth:`~ReplayFront.plan` → its :class:`CostPlan`; :func:`plan_summary` → the numbers both front ends
   report (the CLI's ``--plan-only`` line, the ``cost_plan`` asset's metadata).
2. :meth:`~ReplayFront.keys`: keys cleaned and checked, hosts resolved, outputs writable, for the teachers
   the plan will call (:mod:`preflight`), before anything is sent.
3. :meth:`~ReplayFront.replay` → :class:`ReplayOutcome` (``mode: batch``: through provider batches,
   :mod:`~composer_pipeline.replay.batch`): the ``teacher_replays`` table, its one summary
   and the plan's prediction beside what was billed (:func:`billing.predicted_vs_billed`).

Between the two Dagster steps the prepared run travels as a file (:func:`save_prepared` in ``cost_plan``,
:func:`load_prepared` in ``teacher_replays``, keyed by the Dagster run and partition): the requests are
built once per run; the file is used only when its requests are the ones the checked ``cost_plan`` table
priced (same call ids, same order), else the step prepares again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from composer_pipeline.ledger import Ledger
from composer_pipeline.ledger.billing import predicted_vs_billed
from composer_pipeline.pairs.config import PairRecipe
from composer_pipeline.replay.batch import priced_for_batch, replay_batch
from composer_pipeline.replay.plan import CostPlan, plan_requests
from composer_pipeline.replay.preflight import preflight
from composer_pipeline.replay.prepared import StalePrepared, dump_run, load_run
from composer_pipeline.replay.run import ReplayResult, ReplayRun
from composer_pipeline.teachers.cache import ResponseCache
from composer_pipeline.teachers.config import TeachersConfig, clean_api_keys

# prepared files of runs that never replayed them (a blocked check) go after this
PREPARED_MAX_AGE_S = 24 * 3600


@dataclass
class ReplayOutcome:
    # table teacher_replays + run_report.replay_summary
    result: ReplayResult
    predicted_vs_billed: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class ReplayFront:
    """One replay's front-end sequence (module docstring) over one config, cache and ledger."""

    config: TeachersConfig
    cache: ResponseCache
    ledger: Ledger
    # escalation decides with it (None: the packaged pairs recipe)
    pair_recipe: PairRecipe | None = None

    def prepare(self, states: pa.Table, messages: pa.Table, render_opts) -> ReplayRun:
        return ReplayRun.prepare(states, messages, self.config, render_opts)

    def plan(self, run: ReplayRun) -> CostPlan:
        # priced as batches go out: at each teacher's batch_price_factor
        if self.config.mode == "batch":
            return plan_requests(priced_for_batch(run.requests), self.config, self.cache, self.ledger)
        return run.plan(self.cache, self.ledger)

    def keys(
        self,
        plan: CostPlan,
        api_keys: dict[str, str | None],
        *,
        plan_only: bool = False,
        writable: dict[str, str] | None = None,
    ) -> dict[str, str | None]:
        """The API keys cleaned (:func:`clean_api_keys`) after the pre-flight checks of the teachers the plan
        calls (every teacher for ``plan_only``); a :class:`PreflightError` names each problem."""
        keys = clean_api_keys(self.config, api_keys)
        preflight(self.config, keys, teachers=None if plan_only else plan.teachers_to_call, writable=writable or {})
        return keys

    def replay(
        self,
        run: ReplayRun,
        plan: CostPlan,
        keys: dict[str, str | None],
        run_id: str,
        progress: Callable[[int, int], None] | None = None,
        *,
        wait: bool = True,
    ) -> ReplayOutcome:
        # provider batches (replay/batch.py); wait=False returns after submitting
        if self.config.mode == "batch":
            res = replay_batch(
                run.requests,
                self.config,
                keys,
                cache=self.cache,
                ledger=self.ledger,
                run_id=run_id,
                wait=wait,
                extra_failed=run.unrendered,
            )
        else:
            res = run.replay(
                keys,
                cache=self.cache,
                ledger=self.ledger,
                run_id=run_id,
                progress=progress,
                pair_recipe=self.pair_recipe,
            )
        names = [t.name for t in self.config.teachers]
        return ReplayOutcome(res, predicted_vs_billed(plan, self.ledger, run_id, names))


def plan_summary(plan: CostPlan) -> dict[str, Any]:
    """What a cost plan says, as both front ends report it (numbers as plain floats and ints)."""
    return {
        "calls_planned": plan.table.num_rows,
        "cached_calls": sum(bool(c) for c in plan.table.column("cached").to_pylist()),
        "skipped_calls_by_teacher": {k: int(v) for k, v in plan.skipped_by_teacher.items()},
        "conditional_calls": int(plan.conditional_calls),
        "conditional_worst_case_usd": float(plan.conditional_worst_case_usd),
        "worst_case_usd_total": float(plan.total_worst_case_usd),
        "worst_case_by_teacher": {k: float(v) for k, v in plan.worst_case_by_teacher.items()},
        "predicted_usd_by_teacher": {k: float(v) for k, v in plan.predicted_by_teacher.items()},
        "remaining_budget_by_teacher": {k: float(v) for k, v in plan.remaining_budget_by_teacher.items()},
        "ceiling_usd": float(plan.ceiling_usd),
        "fits": bool(plan.fits),
        "reasons": list(plan.reasons),
    }


def prepared_path(root: str | Path, run_id: str, partition: str) -> Path:
    """Where a Dagster run's prepared requests for one partition live (the key hashed: a partition key holds
    ``/``, a run id is Dagster's uuid)."""
    digest = hashlib.sha256(partition.encode()).hexdigest()[:24]
    return Path(root) / _safe(run_id) / f"{digest}.json"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "_"


def save_prepared(run: ReplayRun, path: Path) -> Path:
    """Write ``run`` to ``path`` atomically (a reader sees the whole file or none); folders of other runs
    older than :data:`PREPARED_MAX_AGE_S` are removed on the way."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _prune(path.parent.parent, keep=path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(dump_run(run))
    os.replace(tmp, path)
    return path


def load_prepared(path: Path, config: TeachersConfig, plan_table: pa.Table) -> ReplayRun | None:
    """The run :func:`save_prepared` wrote, when it holds exactly the requests ``plan_table`` priced (the
    checked ``cost_plan``); None when there is none, it is stale, or it differs (the caller prepares).
    The file is removed once read: a run reads it once."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    path.unlink(missing_ok=True)
    try:
        run = load_run(data, config)
    except (StalePrepared, KeyError, IndexError, TypeError):
        return None
    if [r.call_id for r in run.requests] != plan_table.column("call_id").to_pylist():
        return None
    return run


def _prune(root: Path, keep: Path) -> None:
    now = time.time()
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    for d in entries:
        try:
            if d != keep and d.is_dir() and now - d.stat().st_mtime > PREPARED_MAX_AGE_S:
                shutil.rmtree(d, ignore_errors=True)
        except OSError:
            continue
