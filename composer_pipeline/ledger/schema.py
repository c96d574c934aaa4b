"""The ledger's tables: a versioned schema applied on open, the code version a ledger needs, and the import
of the DuckDB ledger of earlier versions.

In:  a :class:`~composer_pipeline.ledger.backends.LedgerDatabase`'s transaction function and backend.
Out: the tables ``runs``, ``reservations``, ``totals``, ``claims``, ``waiters`` (1), ``teacher_identities``
     (2), ``billed_usage`` (3), the owner of each run and claim and ``ledger_meta`` (4), ``batches`` and
     ``batch_calls`` (5), and
     ``schema_migrations`` (which versions were applied, when); a ledger opened over an earlier
     ``ledger.duckdb`` beside it carries that ledger's spend.

Mixed code versions on one ledger: ``ledger_meta.min_code_version`` is the oldest code that may use the
ledger, counted in schema versions (code "knows" :data:`CODE_VERSION`, the newest migration it has). A
migration that older code would misread (buy again what is paid, share claims) raises it; code older than
it refuses the ledger on open with :class:`LedgerTooNew`, before anything is read or bought. Code from before
version 4 does not read ``ledger_meta``: version 4's new NOT NULL owner columns make its first write (the
run's registration) fail instead, so it stops before it buys.

Deliberately simplified: migrations only go forward (append one, never edit one that has shipped; no
down-migrations); one DDL text for both backends where the two agree (a statement may be a
``{backend: sql}`` entry where they do not, run on that backend only); times as epoch seconds; the DuckDB import reads that
ledger's ``reservations`` only (its spend), not its runs or answers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from composer_pipeline.ledger.backends import Cursor, LedgerError


class LedgerTooNew(LedgerError):
    """The ledger was migrated by newer code that older code would misuse: upgrade before using it."""


# Versioned schema: append a migration, never edit one that has shipped.
MIGRATIONS: list[tuple[int, list[str | dict[str, str]]]] = [
    (
        1,
        [
            """CREATE TABLE runs (
            run_id TEXT PRIMARY KEY,
            host TEXT, pid INTEGER,
            state TEXT NOT NULL,                 -- live | closed | expired
            lease_s DOUBLE PRECISION NOT NULL,
            started_at DOUBLE PRECISION NOT NULL,
            heartbeat_at DOUBLE PRECISION NOT NULL,
            closed_at DOUBLE PRECISION)""",
            """CREATE TABLE reservations (
            id TEXT PRIMARY KEY,
            teacher TEXT NOT NULL,
            run_id TEXT NOT NULL,
            call_id TEXT,
            state TEXT NOT NULL,                 -- reserved | sent | settled | kept | released
            reserved_usd DOUBLE PRECISION NOT NULL,
            cost_usd DOUBLE PRECISION,           -- settled: actual; kept: = reserved_usd; released: 0
            note TEXT,
            created_at DOUBLE PRECISION NOT NULL,
            closed_at DOUBLE PRECISION)""",
            "CREATE INDEX reservations_run ON reservations (run_id, state)",
            """CREATE TABLE totals (
            scope TEXT NOT NULL,                 -- teacher | run
            key TEXT NOT NULL,
            hard_usd DOUBLE PRECISION NOT NULL DEFAULT 0,   -- settled + kept
            open_usd DOUBLE PRECISION NOT NULL DEFAULT 0,   -- reserved + sent (in flight)
            settled_usd DOUBLE PRECISION NOT NULL DEFAULT 0,
            kept_usd DOUBLE PRECISION NOT NULL DEFAULT 0,
            kept_calls INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (scope, key))""",
            """CREATE TABLE claims (
            call_id TEXT PRIMARY KEY,
            teacher TEXT NOT NULL,
            run_id TEXT NOT NULL,
            state TEXT NOT NULL,                 -- inflight | answered | failed
            record TEXT,                         -- the paid answer (the response-cache record), when answered
            reason TEXT,
            cost_usd DOUBLE PRECISION,
            created_at DOUBLE PRECISION NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL)""",
            """CREATE TABLE waiters (
            id TEXT PRIMARY KEY,
            teacher TEXT NOT NULL,
            run_id TEXT NOT NULL,
            amount_usd DOUBLE PRECISION NOT NULL,
            created_at DOUBLE PRECISION NOT NULL)""",
            "CREATE INDEX waiters_teacher ON waiters (teacher, created_at)",
        ],
    ),
    # 2: a teacher name's identity (base_url, model, prices): a recipe reusing the name for another identity is
    # refused instead of sharing its budget and answers (see Ledger.check_identities)
    (
        2,
        [
            """CREATE TABLE teacher_identities (
            teacher TEXT PRIMARY KEY,
            identity TEXT NOT NULL,              -- canonical JSON of TeacherConfig.identity()
            created_at DOUBLE PRECISION NOT NULL)""",
        ],
    ),
    # 3: what each settled call was billed, split by price (prompt caching): ledger/billing.py reads it
    (
        3,
        [
            """CREATE TABLE billed_usage (
            reservation_id TEXT PRIMARY KEY,
            teacher TEXT NOT NULL,
            run_id TEXT NOT NULL,
            call_id TEXT,
            prompt_tokens INTEGER NOT NULL,      -- all prompt tokens (uncached + cache reads + cache writes)
            completion_tokens INTEGER NOT NULL,
            cached_tokens INTEGER NOT NULL,      -- read from the provider's prompt cache
            cache_write_tokens INTEGER NOT NULL, -- written to it (Anthropic)
            billed_usd DOUBLE PRECISION NOT NULL,      -- = the reservation's settled cost_usd
            full_price_usd DOUBLE PRECISION NOT NULL,  -- the same tokens at the full input price
            created_at DOUBLE PRECISION NOT NULL)""",
            "CREATE INDEX billed_usage_teacher ON billed_usage (teacher)",
            "CREATE INDEX billed_usage_run ON billed_usage (run_id)",
        ],
    ),
    # 4: who holds a run and a claim. ``owner`` is a token of one run's process (a run id may be reused, but is
    # held by one live process at a time); ``machine`` is the boot id and PID namespace the run's pid belongs to
    # (a pid is only checked for liveness from the same machine and namespace). Older code would share claims
    # and judge liveness by hostname: its INSERTs name no owner and fail (SQLite: too few values; PostgreSQL:
    # NOT NULL without a default), and ``min_code_version`` makes later code check before it starts.
    (
        4,
        [
            "ALTER TABLE runs ADD COLUMN owner TEXT NOT NULL DEFAULT ''",
            {"postgresql": "ALTER TABLE runs ALTER COLUMN owner DROP DEFAULT"},  # SQLite: a short INSERT fails anyway
            "ALTER TABLE runs ADD COLUMN machine TEXT",
            "ALTER TABLE claims ADD COLUMN owner TEXT NOT NULL DEFAULT ''",
            {"postgresql": "ALTER TABLE claims ALTER COLUMN owner DROP DEFAULT"},  # SQLite: a short INSERT fails anyway
            """CREATE TABLE ledger_meta (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL)""",
            "INSERT INTO ledger_meta VALUES ('min_code_version', '4')",
        ],
    ),
    # 5: provider batches (mode: batch, replay/batch.py). A batch is recorded with its calls and their
    # reservations (state ``batched``: held by the batch, not by a run's lease, so a run that ends or dies
    # leaves them held) BEFORE its POST; the provider's id is written right after the answer. A call is in at
    # most one pending batch (``batch_calls.call_id`` is the key): no process submits it twice. Older code
    # would buy calls a live batch holds and finalize nothing of them: min_code_version 5.
    (
        5,
        [
            """CREATE TABLE batches (
            id TEXT PRIMARY KEY,                 -- ours: the OpenAI metadata cp_batch, found again after a lost answer
            teacher TEXT NOT NULL,
            api TEXT NOT NULL,                   -- openai | anthropic
            run_id TEXT NOT NULL,                -- the replay run that recorded it
            state TEXT NOT NULL,                 -- recorded (POST not answered yet) | submitted | collected
            provider_id TEXT,                    -- the provider's batch id, once known
            n_requests INTEGER NOT NULL,
            reserved_usd DOUBLE PRECISION NOT NULL,
            note TEXT,
            created_at DOUBLE PRECISION NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL)""",
            "CREATE INDEX batches_state ON batches (state, teacher)",
            """CREATE TABLE batch_calls (
            call_id TEXT PRIMARY KEY,
            batch_id TEXT NOT NULL,              -- its current (last) batch
            teacher TEXT NOT NULL,
            reservation_id TEXT NOT NULL,        -- its reservation in that batch (state batched until settled/released)
            state TEXT NOT NULL,                 -- pending | settled | released
            prompt_bound INTEGER NOT NULL,       -- what pricing.settle clamps the billed usage to
            completion_bound INTEGER NOT NULL,
            submissions INTEGER NOT NULL,        -- batches it went out in (a released call goes out alone again)
            note TEXT,
            updated_at DOUBLE PRECISION NOT NULL)""",
            "CREATE INDEX batch_calls_batch ON batch_calls (batch_id, state)",
            "UPDATE ledger_meta SET value = '5' WHERE key = 'min_code_version'",
        ],
    ),
]
# the newest ledger schema this code knows
CODE_VERSION = MIGRATIONS[-1][0]


def migrate(tx: Callable[..., Any], db: Any) -> None:
    """Bring the ledger behind ``tx`` (:meth:`LedgerDatabase._tx`) to the newest version; ``db`` is its backend."""

    def current(c: Cursor) -> bool:
        if not int(c.one(db.has_schema)[0]):
            return False
        have = int(c.one("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")[0])
        if have >= 4:
            need = int(c.one("SELECT value FROM ledger_meta WHERE key = 'min_code_version'")[0])
            if need > CODE_VERSION:
                raise LedgerTooNew(
                    f"ledger {db.label} was migrated to schema {have} by newer composer-pipeline code and needs code "
                    f"that knows schema {need} or later; this code knows schema {CODE_VERSION}. Upgrade "
                    "composer-pipeline on this machine before using this ledger (older code would buy paid answers "
                    "again and misjudge which runs are alive)"
                )
        return have >= CODE_VERSION

    if tx(current, write=False):
        # nothing to create: a role that may only read (``teachers budget``) opens it too
        return

    def run(c: Cursor) -> None:
        db.migration_lock(c.cur)
        c.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
        )
        have = c.one("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")[0]
        for version, stmts in MIGRATIONS:
            if version > have:
                for stmt in stmts:
                    sql = stmt.get(db.kind) if isinstance(stmt, dict) else stmt
                    if sql:
                        c.execute(sql)
                c.execute(f"INSERT INTO schema_migrations VALUES (?, {db.now})", [version])
        legacy = db.legacy_duckdb() if have == 0 else None
        if legacy is not None:
            import_duckdb(c, legacy, db.now)

    tx(run)


def import_duckdb(c: Cursor, src: Path, now: str) -> None:
    """Carry the spend of the DuckDB ledger of earlier versions (``ledger.duckdb`` beside a new
    ``ledger.sqlite``) into the new ledger once, so an upgrade never resets a budget. Settled, kept and
    released rows keep their meaning; rows still open there (killed runs, unused credit) are kept at
    their reserved amount, as that ledger counted them."""
    import duckdb

    con = duckdb.connect(str(src), read_only=True)
    try:
        rows = con.execute(
            "SELECT id, teacher, run_id, call_id, state, reserved_usd, cost_usd, note FROM reservations"
        ).fetchall()
    finally:
        con.close()
    for rid, teacher, run_id, cid, state, reserved, cost, note in rows:
        reserved = float(reserved or 0.0)
        if state == "settled":
            counted, kept = float(cost or 0.0), False
        elif state == "released":
            counted, kept = 0.0, False
        # kept, or still reserved when that ledger was last written
        else:
            state, counted, kept = "kept", reserved, True
        c.execute(
            f"INSERT INTO reservations VALUES (?, ?, ?, ?, ?, ?, ?, ?, {now}, {now})",
            [
                f"duckdb-{rid}",
                teacher,
                run_id,
                cid,
                state,
                reserved,
                counted,
                f"imported from {src.name}" + (f": {note}" if note else ""),
            ],
        )
        for scope, key in (("run", run_id), ("teacher", teacher)):
            c.execute("INSERT INTO totals (scope, key) VALUES (?, ?) ON CONFLICT (scope, key) DO NOTHING", [scope, key])
            c.execute(
                "UPDATE totals SET hard_usd = hard_usd + ?, settled_usd = settled_usd + ?, kept_usd = kept_usd + ?, "
                "kept_calls = kept_calls + ? WHERE scope = ? AND key = ?",
                [
                    counted,
                    0.0 if kept else counted,
                    counted if kept else 0.0,
                    1 if kept and note != "credit" else 0,
                    scope,
                    key,
                ],
            )
