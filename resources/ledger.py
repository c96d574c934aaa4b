"""The teacher budget ledger (DuckDB file) as a Dagster resource.

In: the ledger path from recipes/pipeline.yaml. Out: ``composer_pipeline.teachers.ledger.Ledger``
instances (spend per teacher, reservations, spend per run). The ledger stays on local disk even
when the table store is ``s3://``: DuckDB needs a local file and budget state must not be racy.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg


class LedgerResource(dg.ConfigurableResource):
    """Opens the DuckDB budget ledger; ``path`` is a local file (created on first use)."""

    path: str

    def open(self):
        from composer_pipeline.teachers.ledger import Ledger

        Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        return Ledger(str(Path(self.path).expanduser()))
