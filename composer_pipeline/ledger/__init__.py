"""Budget ledger: claims, reservations and run leases in a transactional store, shared by every
replay process that points at the same URL.

In:  a URL: a file path (embedded SQLite, WAL, the default: nothing to start) or ``postgresql://…``
     (a shared PostgreSQL through psycopg2, the driver dagster-postgres uses). Same schema and
     semantics on both; the schema is versioned (``schema_migrations``, :data:`MIGRATIONS`).
Out: ``reservations`` (every attempt's money), ``claims`` (who is buying which request, and the paid
     answer itself), ``runs`` (leases), ``totals`` (running sums per teacher and per run); reads
     ``spent``/``room``/``balance``/``open_reservations``/``answer``.

The modules, each importing only those above it:

* ``backends.py``: the two databases behind one transaction helper (:class:`~.backends.LedgerDatabase`): a
  connection per thread, retries on lock contention, a lost PostgreSQL server ridden through for
  ``outage_s``, passwords kept out of every message (:func:`redact_url`).
* ``schema.py``: the versioned DDL (:data:`MIGRATIONS`) applied on open, the oldest code version a ledger
  admits (``ledger_meta.min_code_version``, :class:`LedgerTooNew`), and the one-time import of the DuckDB
  ledger of earlier versions.
* ``core.py``: :class:`Ledger`, the money state machine (claim, reserve, mark sent, settle / keep /
  release, leases and reconcile, teacher identities) and its reads; the money rules are in its docstring.
* ``aio.py``: :class:`AsyncLedger`, the ledger as one asyncio replay run sees it (heartbeat, waits, the
  claim watcher), and :class:`ReplayInterrupted`.

Deliberately simplified: see each module; this file only names what the rest of the pipeline imports.
"""

from composer_pipeline.ledger.aio import AsyncLedger, ClaimLost, ReplayInterrupted
from composer_pipeline.ledger.backends import (
    LedgerError,
    LedgerUnavailable,
    is_postgres,
    redact_url,
    redact_url_secrets,
    url_secrets,
)
from composer_pipeline.ledger.core import (
    DEFAULT_LEASE_S,
    DEFAULT_OUTAGE_S,
    Balance,
    Claim,
    Ledger,
    Reservation,
    Reserve,
    RunIdInUse,
    TeacherIdentityError,
    open_ledger,
)
from composer_pipeline.ledger.schema import CODE_VERSION, MIGRATIONS, LedgerTooNew

__all__ = [
    "CODE_VERSION",
    "DEFAULT_LEASE_S",
    "DEFAULT_OUTAGE_S",
    "MIGRATIONS",
    "AsyncLedger",
    "Balance",
    "Claim",
    "ClaimLost",
    "Ledger",
    "LedgerError",
    "LedgerTooNew",
    "LedgerUnavailable",
    "Reservation",
    "Reserve",
    "ReplayInterrupted",
    "RunIdInUse",
    "TeacherIdentityError",
    "is_postgres",
    "open_ledger",
    "redact_url_secrets",
    "redact_url",
    "url_secrets",
]
