"""The teacher budget ledger as a Dagster resource.

In: ``url`` from recipes/pipeline.yaml (``ledger_path``): a local file path (embedded SQLite, the
default) or ``postgresql://user@host/db`` (shared by every run pod; put the password in
``PGPASSWORD``, never in the URL). Out: ``composer_pipeline.ledger.Ledger`` instances.
"""

from __future__ import annotations

import dagster as dg

from composer_pipeline.ledger import Ledger


class LedgerResource(dg.ConfigurableResource):
    """Opens the budget ledger at ``path`` (a file path or a ``postgresql://`` URL; created on first use)."""

    path: str

    def open(self):
        return Ledger(self.path)
