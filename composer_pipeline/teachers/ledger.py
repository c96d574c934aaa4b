"""Budget ledger: claims, reservations and run leases in a transactional store, shared by every
replay process that points at the same URL.

In:  a URL: a file path (embedded SQLite, WAL, the default: nothing to start) or ``postgresql://…``
     (a shared PostgreSQL through psycopg2, the driver dagster-postgres uses). Same schema and
     semantics on both; the schema is versioned (``schema_migrations``, :data:`MIGRATIONS`).
Out: ``reservations`` (every attempt's money), ``claims`` (who is buying which request, and the paid
     answer itself), ``runs`` (leases), ``totals`` (running sums per teacher and per run); reads
     ``spent``/``remaining``/``balances``/``spend_by_run``/``rows``/``answer``.

Money rules (the replay client follows them):

* **claim** a request (unique key = its ``call_id``, the cache key) before buying it: a second run
  that needs the same answer waits for the claimant and takes the answer instead of sending. A claim
  whose run died (lease expired) or that failed is taken over; only a claimant dying mid-flight can
  cause a second purchase.
* **reserve** the worst case before sending. It is granted when ``settled + kept + reserved ≤ budget``
  (and the same for the run ceiling) after serving the waiters of the same teacher that rank before
  it: the run holding the least money in flight first, then first come first served (fair share across
  processes: no run starves). When only money *held by calls in flight* is in the way the
  caller **waits** for them to settle; ``budget_exhausted`` only when ``settled + kept`` alone leaves no
  room.
* **mark sent** just before the request leaves; **settle** at the reported usage (in the same
  transaction the answer is stored in its claim, so a paid answer is durable before anything else
  can fail), **keep** when the outcome is unknown (counted at the worst case forever, labelled),
  **release** when the request certainly was not billed.
* **leases**: a run heartbeats (``lease_s`` in the teachers recipe). A run whose lease expired is
  finalized by :meth:`Ledger.reconcile` (any process does it while waiting, or ``composer-pipeline
  teachers reconcile``): never-sent reservations are released, sent ones are kept at their worst case
  with the note ``lease expired: outcome unknown``, its claims and waits are dropped.

Concurrency: SQLite serializes writers with ``BEGIN IMMEDIATE`` + ``busy_timeout`` (WAL: readers,
e.g. an auditor's connection held open, never block a writer); PostgreSQL locks the ``totals`` and
``claims`` rows a transaction decides on (``SELECT … FOR UPDATE``) and retries on deadlock. Time
comes from the database's clock, so leases agree across hosts. A PostgreSQL server lost after the ledger
was opened (restart, stop, failover) is ridden through: each transaction reopens its thread's connection
and retries with backoff until ``outage_s`` (then :class:`LedgerUnavailable`). A teacher name has one
identity per ledger (``teacher_identities``, :meth:`Ledger.check_identities`). DuckDB stays the SQL engine over the
Parquet tables; it is not used here.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import orjson

from composer_pipeline import home
from composer_pipeline.teachers.config import TeachersConfig

EPS = 1e-12  # float slack when comparing sums of dollars
DEFAULT_LEASE_S = TeachersConfig.lease_s  # one home: the teachers recipe's defaults
DEFAULT_OUTAGE_S = TeachersConfig.ledger_outage_s  # a PostgreSQL restart or failover takes seconds; a server down longer stops the run
OPEN_STATES = ("reserved", "sent")

# Versioned schema: append a migration, never edit one that has shipped.
MIGRATIONS: list[tuple[int, list[str]]] = [
    (1, [
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
    ]),
    # 2: a teacher name's identity (base_url, model, prices): a recipe reusing the name for another identity is
    # refused instead of sharing its budget and answers (see Ledger.check_identities)
    (2, [
        """CREATE TABLE teacher_identities (
            teacher TEXT PRIMARY KEY,
            identity TEXT NOT NULL,              -- canonical JSON of TeacherConfig.identity()
            created_at DOUBLE PRECISION NOT NULL)""",
    ]),
    # 3: what each settled call was billed, split by price (prompt caching): teachers/billing.py reads it
    (3, [
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
    ]),
]


@dataclass
class Reserve:
    teacher: str
    budget_usd: float
    run_id: str
    ceiling_usd: float
    amount_usd: float
    call_id: str = ""


@dataclass(frozen=True)
class Reservation:
    ok: bool
    id: str
    reason: str = ""  # why it was refused (or, with wait=True, what it waits for)
    wait: bool = False  # not granted yet: money held by calls in flight or earlier waiters


@dataclass(frozen=True)
class Claim:
    state: str  # mine | answered | wait
    record: dict[str, Any] | None = None  # the answer, when answered
    owner: str = ""  # the run holding it, when wait


@dataclass(frozen=True)
class Balance:
    teacher: str
    budget_usd: float
    spent_usd: float  # settled + kept + reserved (what the budget check counts)
    settled_usd: float
    kept_usd: float
    reserved_usd: float  # held by calls in flight
    remaining_usd: float
    kept_calls: int

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 8) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


class LedgerError(RuntimeError):
    """The ledger store cannot be opened or written (bad path, server down); names the URL, never a password."""


class LedgerUnavailable(LedgerError):
    """The ledger's server cannot be reached (refused, restarting, connection dropped). After the ledger was
    once opened, a transaction meeting it reconnects and retries until ``Ledger.outage_s`` has passed."""


class TeacherIdentityError(ValueError):
    """A recipe gives a teacher name the ledger already knows a different identity (base_url, model, prices)."""


class ReplayInterrupted(RuntimeError):
    """SIGTERM/SIGINT arrived: the run closed its ledger run (nothing left reserved) and stops."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}: ledger run closed "
                         "(calls not sent released, calls in flight kept at worst case); re-run to finish")


_URL_PASSWORD_RE = re.compile(r"(?i)((?:^|[?&;\s])(?:password|passwd|pwd|sslpassword)=)[^&;\s]*")


def _userinfo(rest: str) -> tuple[str, str, str]:
    """``user``, ``password`` (may be empty) and what follows the ``@`` of a URL without its scheme. The
    ``@`` is the last one before the query (a password may hold ``/``, ``@`` or ``%`` written raw)."""
    q = rest.find("?")
    at = rest.rfind("@", 0, len(rest) if q < 0 else q)
    if at < 0:
        at = rest.rfind("@")
    if at < 0:
        return "", "", rest
    user, _, password = rest[:at].partition(":")
    return user, password, rest[at + 1:]


def redact_url(url: str) -> str:
    """The URL without its password (safe for logs, metadata and JSON output): the ``user:password@`` part and
    any ``password=`` query parameter; never parsed with anything that could raise and echo it."""
    if "://" not in url:
        return url
    scheme, _, rest = url.partition("://")
    user, password, after = _userinfo(rest)
    if password:
        rest = f"{user}:***@{after}"
    return _URL_PASSWORD_RE.sub(r"\1***", f"{scheme}://{rest}")


def url_secrets(url: str) -> list[str]:
    """Every password a ledger URL carries, as written and percent-decoded (to remove from error text)."""
    from urllib.parse import unquote

    found = [_userinfo(url.partition("://")[2])[1]]
    found += [m.group(0).split("=", 1)[1] for m in _URL_PASSWORD_RE.finditer(url)]
    out = set()
    for v in found:
        if v:
            out |= {v, unquote(v)}
    return sorted((v for v in out if v), key=len, reverse=True)


def redact_text(text: str, url: str) -> str:
    """``text`` (a driver's error message) without the URL's passwords, in any form the driver may echo them."""
    for v in url_secrets(url):
        text = text.replace(v, "***")
    # libpq quotes a malformed percent-escape it could not decode ("invalid percent-encoded token: \"p%zz\"")
    return re.sub(r'(invalid percent-encoded token:\s*)"[^"]*"', r'\1"***"', text)


def is_postgres(url: str) -> bool:
    return str(url).startswith(("postgresql://", "postgres://"))


# ----------------------------------------------------------------------------------------------
class _SQLite:
    kind = "sqlite"
    now = "((julianday('now') - 2440587.5) * 86400.0)"
    for_update = ""
    begin = "BEGIN IMMEDIATE"  # take the write lock up front: no lock upgrades, no deadlocks

    def __init__(self, path: str):
        self.path = Path(path.removeprefix("sqlite:///") if path.startswith("sqlite:///") else path).expanduser()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LedgerError(f"ledger {self.path}: cannot create its directory: {e.strerror}") from None
        self.label = str(self.path)

    def connect(self):
        """A connection in WAL mode. The file itself is never opened by Python here: POSIX drops every lock
        a process holds on a file when *any* descriptor of it is closed (sqlite.org/howtocorrupt.html §2.2),
        so an ``open()``/``close()`` of the database beside live connections leaves this process holding no
        lock; another process closing its last connection then believes it is the last one, checkpoints and
        deletes the WAL, and every later write of this process goes to the deleted file and is lost."""
        import sqlite3

        for attempt in range(50):
            con = None
            try:
                con = sqlite3.connect(str(self.path), timeout=120, isolation_level=None, check_same_thread=False)
                con.execute("PRAGMA busy_timeout = 120000")
                # switching a new file to WAL needs an exclusive lock and may answer "locked" at once while
                # another process creates the same file (the busy handler is not always used): retry
                con.execute("PRAGMA journal_mode = WAL")
                con.execute("PRAGMA synchronous = NORMAL")  # WAL: durable across process crashes (kill -9)
                return con
            except sqlite3.DatabaseError as e:
                if con is not None:
                    con.close()
                if self.retryable(e) and attempt < 49:
                    time.sleep(random.uniform(0.01, 0.05) * min(attempt + 1, 10))
                    continue
                if "not a database" in str(e) and self._is_duckdb():
                    raise LedgerError(f"ledger {self.path} is a DuckDB ledger of an earlier version: point the ledger at "
                                      f"{self.path.with_suffix('.sqlite')} (its spend is imported from this file on first use)") from None
                raise LedgerError(f"ledger {self.path}: cannot open: {e}") from None
        raise AssertionError("unreachable")

    def check_wal(self, state: threading.local) -> None:
        """After a write: this connection's WAL is still the file on disk. While any connection of this
        process is open no other process may delete the WAL; if one did anyway (this process lost its
        locks, see :meth:`connect`), this write and every later one would be invisible to everyone else:
        fail loudly instead of spending against a ledger nobody can read."""
        try:
            ino = os.stat(f"{self.path}-wal").st_ino
        except FileNotFoundError:
            ino = None
        seen = getattr(state, "wal_ino", None)
        if ino is not None and seen in (None, ino):
            state.wal_ino = ino
            return
        raise LedgerError(f"ledger {self.path}: its write-ahead log was deleted or replaced while this process had it open, "
                          "so writes since then are lost to other processes; something in this process opened and closed "
                          "the database file directly (that drops SQLite's locks). Stop this run and re-run it.")

    def _is_duckdb(self) -> bool:
        """Whether the file is a DuckDB database. Only called once SQLite refused the file, so no SQLite
        connection of this process can hold a lock on it (see :meth:`connect`)."""
        try:
            with open(self.path, "rb") as f:
                return f.read(16)[8:12] == b"DUCK"
        except OSError:
            return False

    def sql(self, q: str) -> str:
        return q

    def legacy_duckdb(self) -> Path | None:
        """The DuckDB ledger earlier versions kept beside this file (``ledger.duckdb``), if any."""
        p = self.path.with_suffix(".duckdb")
        return p if p != self.path and p.is_file() else None

    def retryable(self, e: BaseException) -> bool:
        import sqlite3

        return isinstance(e, sqlite3.OperationalError) and "locked" in str(e)

    def migration_lock(self, cur) -> None:
        pass  # BEGIN IMMEDIATE already excludes every other writer

    def disconnected(self, e: BaseException) -> bool:
        return False  # an embedded file has no connection to lose

    def beat(self, column: str) -> str:
        return column

    has_schema = "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"


class _Postgres:
    kind = "postgresql"
    now = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"
    for_update = " FOR UPDATE"
    begin = "BEGIN"

    def __init__(self, url: str):
        self.url = url
        self.label = redact_url(url)

    def connect(self):
        import psycopg2

        try:
            # keepalives: a server that vanished without closing the socket is noticed within ~25 s, not hours
            con = psycopg2.connect(self.url, connect_timeout=10, keepalives=1, keepalives_idle=10,
                                   keepalives_interval=5, keepalives_count=3)
        except psycopg2.OperationalError as e:  # refused, starting up, shutting down: may pass
            raise LedgerUnavailable(f"ledger {self.label}: cannot connect: {self.reason(e)}") from None
        except psycopg2.Error as e:
            raise LedgerError(f"ledger {self.label}: cannot connect: {self.reason(e)}") from None
        con.autocommit = True  # transactions are explicit BEGIN/COMMIT, as on SQLite
        return con

    def reason(self, e: BaseException) -> str:
        """First line of a driver error, without any password of the URL."""
        text = str(e).strip()
        return redact_text(text.splitlines()[0], self.url) if text else type(e).__name__

    def disconnected(self, e: BaseException) -> bool:
        """The connection is gone or the server cannot take it now (restart, stop, admin shutdown)."""
        import psycopg2

        return isinstance(e, (LedgerUnavailable, psycopg2.OperationalError, psycopg2.InterfaceError))

    has_schema = "SELECT COUNT(*) FROM pg_catalog.pg_class WHERE oid = to_regclass('schema_migrations')"

    def beat(self, column: str) -> str:
        """A run's last heartbeat as leases judge it: never before the server (re)started, since no run could
        heartbeat while it was down (a restart longer than a lease must not expire every live run at once)."""
        return f"GREATEST({column}, CAST(EXTRACT(EPOCH FROM pg_postmaster_start_time()) AS DOUBLE PRECISION))"

    def sql(self, q: str) -> str:
        return q.replace("?", "%s")

    def legacy_duckdb(self) -> Path | None:
        return None

    def retryable(self, e: BaseException) -> bool:
        import psycopg2.errors

        return isinstance(e, (psycopg2.errors.DeadlockDetected, psycopg2.errors.SerializationFailure))

    def migration_lock(self, cur) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(724011601)")  # one migrator at a time

    def check_wal(self, state: threading.local) -> None:
        pass  # the server owns durability


class Ledger:
    """The ledger at ``url`` (file path → SQLite, ``postgresql://`` → PostgreSQL); thread-safe."""

    def __init__(self, url: str | Path, *, outage_s: float = DEFAULT_OUTAGE_S):
        url = str(url)
        self.url = url
        self._db = _Postgres(url) if is_postgres(url) else _SQLite(url)
        self._local = threading.local()
        self.outage_s = float(outage_s)  # how long a transaction rides through a lost server before it fails
        self._opened = False  # a server unreachable at open is an error at once; later, an outage to ride through
        self._outage_since: float | None = None  # monotonic time the current outage began (shared by all threads)
        self._migrate()
        self._opened = True

    @property
    def label(self) -> str:
        """Where the ledger is, password removed."""
        return self._db.label

    @property
    def backend(self) -> str:
        return self._db.kind

    # -- plumbing
    def _con(self):
        con = getattr(self._local, "con", None)
        if con is None:
            con = self._local.con = self._db.connect()
            self._local.wal_ino = None
        return con

    def disconnect(self) -> None:
        """Close this thread's connection (``close`` settles a reservation)."""
        con = getattr(self._local, "con", None)
        if con is not None:
            self._local.con = None
            try:
                con.close()
            except Exception:
                pass  # already broken

    def _tx(self, fn: Callable[[Any], Any], *, write: bool = True) -> Any:
        """Run ``fn(cursor)`` in one transaction; retried on deadlock / lock timeouts. A lost server (restart,
        stop, dropped connection) is ridden through: the connection is reopened and the transaction retried,
        with backoff, until ``outage_s`` has passed, then :class:`LedgerUnavailable`. A retried transaction may
        repeat one whose COMMIT reached the server before the connection broke: every write here is idempotent
        on retry or leaves at worst a ``reserved`` row of this run, released when the run closes."""
        attempt = 0
        pause = 0.05
        while True:
            cur = None
            try:
                con = self._con()
                cur = con.cursor()
                cur.execute(self._db.begin if write else "BEGIN")
                try:
                    out = fn(_Cursor(cur, self._db))
                    cur.execute("COMMIT")
                    self._outage_since = None
                    if write:
                        self._db.check_wal(self._local)
                    return out
                except BaseException:
                    try:
                        cur.execute("ROLLBACK")
                    except Exception:
                        pass
                    raise
            except Exception as e:
                if self._db.retryable(e) and attempt < 7:
                    attempt += 1
                    time.sleep(random.uniform(0.01, 0.05) * attempt)
                    continue
                if self._opened and self._db.disconnected(e):
                    self.disconnect()  # reopened by the next attempt
                    now = time.monotonic()
                    if self._outage_since is None:
                        self._outage_since = now
                    outage_until = self._outage_since + self.outage_s  # one deadline per outage, not per transaction
                    if now < outage_until:
                        time.sleep(min(pause, outage_until - now) * random.uniform(0.5, 1.0))
                        pause = min(pause * 2, 1.0)
                        continue
                    why = str(e).split(": ", 1)[-1] if isinstance(e, LedgerError) else self._reason(e)
                    raise LedgerUnavailable(f"ledger {self.label}: unreachable for {self.outage_s:g}s ({why}); "
                                            "this run stops. Its reservations are finalized by the next replay or "
                                            "`composer-pipeline teachers reconcile` once the server is back") from None
                if isinstance(e, LedgerError):
                    raise
                if type(e).__module__.startswith(("sqlite3", "psycopg2")):
                    raise LedgerError(f"ledger {self.label}: {type(e).__name__}: {self._reason(e)[:300]}") from None
                raise
            finally:
                if cur is not None:
                    try:
                        cur.close()
                    except Exception:
                        pass  # the connection under it is gone

    def _reason(self, e: BaseException) -> str:
        text = " ".join(str(e).split()) or type(e).__name__
        return redact_text(text, self.url)

    def _migrate(self) -> None:
        def current(c: _Cursor) -> bool:
            if not int(c.one(self._db.has_schema)[0]):
                return False
            return int(c.one("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")[0]) >= MIGRATIONS[-1][0]

        if self._tx(current, write=False):
            return  # nothing to create: a role that may only read (``teachers budget``) opens it too

        def run(c: _Cursor) -> None:
            self._db.migration_lock(c.cur)
            c.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)")
            have = c.one("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")[0]
            for version, stmts in MIGRATIONS:
                if version > have:
                    for s in stmts:
                        c.execute(s)
                    c.execute(f"INSERT INTO schema_migrations VALUES (?, {self._db.now})", [version])
            legacy = self._db.legacy_duckdb() if have == 0 else None
            if legacy is not None:
                self._import_duckdb(c, legacy)

        self._tx(run)

    def _import_duckdb(self, c: _Cursor, src: Path) -> None:
        """Carry the spend of the DuckDB ledger of earlier versions (``ledger.duckdb`` beside a new
        ``ledger.sqlite``) into the new ledger once, so an upgrade never resets a budget. Settled, kept and
        released rows keep their meaning; rows still open there (killed runs, unused credit) are kept at
        their reserved amount, as that ledger counted them."""
        import duckdb

        con = duckdb.connect(str(src), read_only=True)
        try:
            rows = con.execute("SELECT id, teacher, run_id, call_id, state, reserved_usd, cost_usd, note FROM reservations").fetchall()
        finally:
            con.close()
        now = self._db.now
        for rid, teacher, run_id, cid, state, reserved, cost, note in rows:
            reserved = float(reserved or 0.0)
            if state == "settled":
                counted, kept = float(cost or 0.0), False
            elif state == "released":
                counted, kept = 0.0, False
            else:  # kept, or still reserved when that ledger was last written
                state, counted, kept = "kept", reserved, True
            c.execute(f"INSERT INTO reservations VALUES (?, ?, ?, ?, ?, ?, ?, ?, {now}, {now})",
                      [f"duckdb-{rid}", teacher, run_id, cid, state, reserved, counted, f"imported from {src.name}" + (f": {note}" if note else "")])
            for scope, key in (("run", run_id), ("teacher", teacher)):
                c.execute("INSERT INTO totals (scope, key) VALUES (?, ?) ON CONFLICT (scope, key) DO NOTHING", [scope, key])
                c.execute("UPDATE totals SET hard_usd = hard_usd + ?, settled_usd = settled_usd + ?, kept_usd = kept_usd + ?, "
                          "kept_calls = kept_calls + ? WHERE scope = ? AND key = ?",
                          [counted, 0.0 if kept else counted, counted if kept else 0.0, 1 if kept and note != "credit" else 0, scope, key])

    def schema_version(self) -> int:
        return int(self._tx(lambda c: c.one("SELECT MAX(version) FROM schema_migrations")[0], write=False))

    # -- teacher identities
    def check_identities(self, identities: dict[str, dict[str, Any]], *, register: bool = True) -> None:
        """Each teacher name has one identity (``TeacherConfig.identity()``: base_url, model, prices) on a
        ledger: the first run that uses a name registers it (``register``), a later recipe giving the name
        another identity is refused with :class:`TeacherIdentityError` naming both, before anything is
        reserved. (Sharing the name would share its budget and, for a different model or endpoint, mislabel
        its spend.) The budget is not part of the identity: raising it is how a lifetime budget grows."""
        if not identities:
            return
        want = {name: orjson.dumps(ident, option=orjson.OPT_SORT_KEYS).decode() for name, ident in identities.items()}
        now = self._db.now

        def run(c: _Cursor) -> dict[str, str]:
            if register:
                for name, ident in sorted(want.items()):
                    c.execute(f"INSERT INTO teacher_identities VALUES (?, ?, {now}) ON CONFLICT (teacher) DO NOTHING", [name, ident])
            names = sorted(want)
            rows = c.all(f"SELECT teacher, identity FROM teacher_identities WHERE teacher IN ({','.join('?' * len(names))})", names)
            return dict(rows)

        have = self._tx(run, write=register)
        clashes = [f"teacher {name!r}: this recipe has {want[name]}, the ledger {self.label} already knows it as {have[name]}"
                   for name in sorted(want) if name in have and have[name] != want[name]]
        if clashes:
            raise TeacherIdentityError(
                "a teacher name is reused for a different endpoint, model or price; give it a new name (a new name "
                "has its own budget and answers) or use another ledger:\n  " + "\n  ".join(clashes))

    # -- runs and leases
    def start_run(self, run_id: str, lease_s: float = DEFAULT_LEASE_S) -> None:
        """Register (or revive) a live run with a lease of ``lease_s`` seconds from now."""
        now = self._db.now

        def run(c: _Cursor) -> None:
            c.execute(f"INSERT INTO runs VALUES (?, ?, ?, 'live', ?, {now}, {now}, NULL) ON CONFLICT (run_id) DO UPDATE SET "
                      f"state = 'live', lease_s = excluded.lease_s, heartbeat_at = excluded.heartbeat_at, pid = excluded.pid, "
                      "host = excluded.host, closed_at = NULL", [run_id, socket.gethostname(), os.getpid(), float(lease_s)])

        self._tx(run)

    def heartbeat(self, run_id: str) -> bool:
        """Extend the lease; False when the run was already finalized (its lease had expired)."""
        return bool(self._tx(lambda c: c.execute(f"UPDATE runs SET heartbeat_at = {self._db.now} WHERE run_id = ? AND state = 'live'",
                                                 [run_id]).rowcount))

    def close_run(self, run_id: str, note: str = "run ended") -> dict[str, int]:
        """Finalize a run that is ending: never-sent reservations released, sent ones kept."""
        return self._tx(lambda c: self._finalize(c, run_id, "closed", note))

    def reconcile(self) -> dict[str, Any]:
        """Finalize every run whose lease expired, and at once every live run of a process on this host that
        no longer exists (kill -9: no need to wait out its lease); what was done, for the CLI and the logs."""
        host = socket.gethostname()
        local = self._tx(lambda c: c.all("SELECT run_id, pid FROM runs WHERE state = 'live' AND host = ?", [host]), write=False)
        gone = {rid for rid, pid in local if pid and not _pid_alive(int(pid))}

        def run(c: _Cursor) -> dict[str, Any]:
            expired = [r[0] for r in c.all(f"SELECT run_id FROM runs WHERE state = 'live' AND {self._db.beat('heartbeat_at')} + lease_s < {self._db.now} ORDER BY run_id")]
            expired += sorted(gone - set(expired))
            # reservations of runs that never registered (a direct Ledger.reserve without start_run) are covered
            # by the auto-registration in try_reserve, so every open reservation has a runs row
            out = {"expired_runs": expired, "released": 0, "kept": 0, "claims_dropped": 0}
            for rid in expired:
                got = self._finalize(c, rid, "expired", "lease expired (process gone)" if rid in gone else "lease expired")
                for k in ("released", "kept", "claims_dropped"):
                    out[k] += got[k]
            return out

        return self._tx(run)

    def _finalize(self, c: _Cursor, run_id: str, final_state: str, note: str) -> dict[str, int]:
        now = self._db.now
        c.one(f"SELECT state FROM runs WHERE run_id = ?{self._db.for_update}", [run_id])
        rows = c.all(f"SELECT id, teacher, state, reserved_usd FROM reservations WHERE run_id = ? AND state IN ('reserved', 'sent') ORDER BY id",
                     [run_id])
        released = kept = 0
        moves: dict[tuple[str, str], list[float]] = {}
        for rid, teacher, state, amount in rows:
            if state == "reserved":  # never sent: certainly not billed
                c.execute(f"UPDATE reservations SET state = 'released', cost_usd = 0, note = ?, closed_at = {now} WHERE id = ?",
                          [f"{note}: never sent", rid])
                released += 1
                counted, kept_n = 0.0, 0
            else:  # sent, outcome unknown: counted at its worst case
                c.execute(f"UPDATE reservations SET state = 'kept', cost_usd = reserved_usd, note = ?, closed_at = {now} WHERE id = ?",
                          [f"{note}: outcome unknown, counted at worst case", rid])
                kept += 1
                counted, kept_n = float(amount), 1
            for key in (("run", run_id), ("teacher", teacher)):
                m = moves.setdefault(key, [0.0, 0.0, 0])
                m[0] += float(amount)
                m[1] += counted
                m[2] += kept_n
        for (scope, key) in sorted(moves):
            opened, counted, kept_n = moves[(scope, key)]
            c.execute("UPDATE totals SET open_usd = open_usd - ?, hard_usd = hard_usd + ?, kept_usd = kept_usd + ?, "
                      "kept_calls = kept_calls + ? WHERE scope = ? AND key = ?", [opened, counted, counted, kept_n, scope, key])
        dropped = c.execute("DELETE FROM claims WHERE run_id = ? AND state = 'inflight'", [run_id]).rowcount
        c.execute("DELETE FROM waiters WHERE run_id = ?", [run_id])
        c.execute(f"UPDATE runs SET state = ?, closed_at = {now} WHERE run_id = ? AND state = 'live'", [final_state, run_id])
        return {"released": released, "kept": kept, "claims_dropped": max(dropped, 0)}

    # -- claims
    def claim(self, call_id: str, teacher: str, run_id: str) -> Claim:
        """Claim the purchase of ``call_id`` for ``run_id``: mine, already answered (with the answer), or wait."""
        now = self._db.now

        def run(c: _Cursor) -> Claim:
            ins = c.execute(f"INSERT INTO claims VALUES (?, ?, ?, 'inflight', NULL, NULL, NULL, {now}, {now}) ON CONFLICT (call_id) DO NOTHING",
                            [call_id, teacher, run_id])
            if ins.rowcount == 1:
                return Claim("mine")
            state, owner, record = c.one(f"SELECT state, run_id, record FROM claims WHERE call_id = ?{self._db.for_update}", [call_id])
            if state == "answered":
                return Claim("answered", orjson.loads(record))
            if state == "inflight" and owner != run_id:
                live = c.one(f"SELECT 1 FROM runs WHERE run_id = ? AND state = 'live' AND {self._db.beat('heartbeat_at')} + lease_s >= {now}", [owner])
                if live:
                    return Claim("wait", owner=owner)
            c.execute(f"UPDATE claims SET run_id = ?, state = 'inflight', reason = NULL, updated_at = {now} WHERE call_id = ?",
                      [run_id, call_id])
            return Claim("mine")

        return self._tx(run)

    def claims_status(self, call_ids: list[str]) -> dict[str, str]:
        """call_id → answered | failed | inflight | orphaned (claimant's lease expired) | free (no claim)."""
        if not call_ids:
            return {}
        out = {cid: "free" for cid in call_ids}

        def run(c: _Cursor) -> None:
            for i in range(0, len(call_ids), 500):
                chunk = call_ids[i:i + 500]
                q = (f"SELECT c.call_id, c.state, CASE WHEN r.state = 'live' AND {self._db.beat('r.heartbeat_at')} + r.lease_s >= {self._db.now} THEN 1 ELSE 0 END "
                     f"FROM claims c LEFT JOIN runs r ON r.run_id = c.run_id WHERE c.call_id IN ({','.join('?' * len(chunk))})")
                for cid, state, live in c.all(q, chunk):
                    out[cid] = "orphaned" if state == "inflight" and not live else state

        self._tx(run, write=False)
        return out

    def fail_claim(self, call_id: str, run_id: str, reason: str) -> None:
        """The claimant gave up without an answer: the next run that needs it may buy it."""
        self._tx(lambda c: c.execute(f"UPDATE claims SET state = 'failed', reason = ?, updated_at = {self._db.now} "
                                     "WHERE call_id = ? AND run_id = ? AND state = 'inflight'", [reason[:300], call_id, run_id]))

    def answer(self, call_id: str) -> dict[str, Any] | None:
        """The paid answer stored with its claim (the response-cache record), if any."""
        row = self._tx(lambda c: c.one("SELECT record FROM claims WHERE call_id = ? AND state = 'answered'", [call_id]), write=False)
        return orjson.loads(row[0]) if row else None

    def answered_ids(self, call_ids: list[str]) -> set[str]:
        st = self.claims_status(call_ids)
        return {k for k, v in st.items() if v == "answered"}

    # -- reservations
    def try_reserve(self, op: Reserve, waiter_id: str | None = None) -> Reservation:
        """One attempt: granted, refused (no room even if every call in flight settles at 0), or wait."""
        now = self._db.now
        waiter_id = waiter_id or uuid.uuid4().hex
        amount = float(op.amount_usd)

        def run(c: _Cursor) -> Reservation:
            c.execute(f"INSERT INTO runs VALUES (?, ?, ?, 'live', ?, {now}, {now}, NULL) ON CONFLICT (run_id) DO NOTHING",
                      [op.run_id, socket.gethostname(), os.getpid(), DEFAULT_LEASE_S])
            for scope, key in (("run", op.run_id), ("teacher", op.teacher)):
                c.execute("INSERT INTO totals (scope, key) VALUES (?, ?) ON CONFLICT (scope, key) DO NOTHING", [scope, key])
            r_hard, r_open = c.one(f"SELECT hard_usd, open_usd FROM totals WHERE scope = 'run' AND key = ?{self._db.for_update}", [op.run_id])
            t_hard, t_open = c.one(f"SELECT hard_usd, open_usd FROM totals WHERE scope = 'teacher' AND key = ?{self._db.for_update}", [op.teacher])
            t_room, r_room = op.budget_usd - t_hard, op.ceiling_usd - r_hard
            refusal = ""
            if amount > t_room + EPS:
                refusal = f"teacher budget: worst case ${amount:.6f} > remaining ${max(t_room, 0):.6f} of ${op.budget_usd:g}"
            elif amount > r_room + EPS:
                refusal = f"run ceiling: worst case ${amount:.6f} > remaining ${max(r_room, 0):.6f} of ${op.ceiling_usd:g}"
            mine = c.one("SELECT created_at FROM waiters WHERE id = ?", [waiter_id])
            if refusal:
                if mine:
                    c.execute("DELETE FROM waiters WHERE id = ?", [waiter_id])
                return Reservation(False, "", refusal)
            # fair share: waiters of this teacher are served first, the run holding the least money in flight
            # first, then in order of arrival; a newcomer queues behind the waiters of its rank. Ranked in Python
            # with one key function, so every waiter sees the same total order (no cycles, no deadlock).
            waiting = c.all("SELECT w.id, w.created_at, w.amount_usd, COALESCE(t.open_usd, 0) FROM waiters w "
                            "LEFT JOIN totals t ON t.scope = 'run' AND t.key = w.run_id WHERE w.teacher = ?", [op.teacher])
            me = (round(float(r_open), 9), mine[0] if mine else float("inf"), waiter_id)
            ahead = sum(float(amt) for wid, created, amt, held in waiting
                        if wid != waiter_id and (round(float(held), 9), created, wid) < me)
            t_free, r_free = t_room - t_open - float(ahead), r_room - r_open
            if amount <= t_free + EPS and amount <= r_free + EPS:
                rid = uuid.uuid4().hex
                c.execute(f"INSERT INTO reservations VALUES (?, ?, ?, ?, 'reserved', ?, NULL, NULL, {now}, NULL)",
                          [rid, op.teacher, op.run_id, op.call_id or None, amount])
                for scope, key in (("run", op.run_id), ("teacher", op.teacher)):
                    c.execute("UPDATE totals SET open_usd = open_usd + ? WHERE scope = ? AND key = ?", [amount, scope, key])
                if mine:
                    c.execute("DELETE FROM waiters WHERE id = ?", [waiter_id])
                return Reservation(True, rid)
            if not mine:
                c.execute(f"INSERT INTO waiters VALUES (?, ?, ?, ?, {now})", [waiter_id, op.teacher, op.run_id, amount])
            what = "teacher budget" if amount > t_free + EPS else "run ceiling"
            return Reservation(False, "", f"{what}: waiting for calls in flight to settle", wait=True)

        return self._tx(run)

    def reserve(self, teacher: str, amount_usd: float, *, budget_usd: float, run_id: str, ceiling_usd: float,
                call_id: str = "", wait_s: float = 0.0, poll_s: float = 0.02) -> Reservation:
        """Reserve, waiting up to ``wait_s`` for money held in flight; refused when it cannot fit."""
        op = Reserve(teacher, budget_usd, run_id, ceiling_usd, amount_usd, call_id)
        waiter = uuid.uuid4().hex
        deadline = time.monotonic() + wait_s
        while True:
            res = self.try_reserve(op, waiter)
            if not res.wait or time.monotonic() >= deadline:
                if res.wait:
                    self._tx(lambda c: c.execute("DELETE FROM waiters WHERE id = ?", [waiter]))
                return res
            time.sleep(poll_s)

    def mark_sent(self, reservation_id: str) -> None:
        """The request is about to leave: from now on an unknown outcome is kept, not released."""
        self._tx(lambda c: c.execute("UPDATE reservations SET state = 'sent' WHERE id = ? AND state = 'reserved'", [reservation_id]))

    def close(self, reservation_id: str, state: str, cost_usd: float | None = None, note: str = "",
              answer: tuple[str, dict[str, Any]] | None = None, usage: dict[str, Any] | None = None) -> bool:
        """Settle / keep / release one reservation; with ``answer=(call_id, record)`` the answer is stored in
        its claim in the same transaction. False when it was already closed (e.g. finalized by reconcile).
        ``usage`` (a settle's :class:`~composer_pipeline.teachers.pricing.Billed` as a dict) is recorded in
        ``billed_usage`` in the same transaction."""
        if state not in ("settled", "kept", "released"):
            raise ValueError(f"unknown reservation state {state!r}")
        now = self._db.now

        def run(c: _Cursor) -> bool:
            row = c.one(f"SELECT teacher, run_id, state, reserved_usd FROM reservations WHERE id = ?{self._db.for_update}", [reservation_id])
            done = False
            if row and row[2] in OPEN_STATES:
                teacher, run_id, _, amount = row
                counted = {"settled": float(cost_usd or 0.0), "kept": float(amount), "released": 0.0}[state]
                c.execute(f"UPDATE reservations SET state = ?, cost_usd = ?, note = ?, closed_at = {now} WHERE id = ?",
                          [state, counted, note[:300] or None, reservation_id])
                s_add = counted if state == "settled" else 0.0
                k_add = counted if state == "kept" else 0.0
                for scope, key in (("run", run_id), ("teacher", teacher)):
                    c.execute("UPDATE totals SET open_usd = open_usd - ?, hard_usd = hard_usd + ?, settled_usd = settled_usd + ?, "
                              "kept_usd = kept_usd + ?, kept_calls = kept_calls + ? WHERE scope = ? AND key = ?",
                              [float(amount), counted, s_add, k_add, 1 if state == "kept" else 0, scope, key])
                done = True
                if usage is not None and state == "settled":
                    c.execute(f"INSERT INTO billed_usage (reservation_id, teacher, run_id, call_id, prompt_tokens, completion_tokens, "
                              f"cached_tokens, cache_write_tokens, billed_usd, full_price_usd, created_at) "
                              f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {now})",
                              [reservation_id, teacher, run_id, answer[0] if answer else None, int(usage["prompt_tokens"]),
                               int(usage["completion_tokens"]), int(usage["cached_tokens"]), int(usage["cache_write_tokens"]),
                               counted, float(usage["full_price_usd"])])
            if answer is not None:
                cid, record = answer
                teacher_name = record.get("teacher") or (row[0] if row else "")
                c.execute(f"INSERT INTO claims VALUES (?, ?, ?, 'answered', ?, NULL, ?, {now}, {now}) ON CONFLICT (call_id) DO UPDATE SET "
                          f"state = 'answered', record = excluded.record, cost_usd = excluded.cost_usd, reason = NULL, updated_at = {now}",
                          [cid, teacher_name, record.get("run_id") or (row[1] if row else ""), orjson.dumps(record).decode(),
                           record.get("cost_usd")])
            return done

        return self._tx(run)

    def settle(self, reservation_id: str, cost_usd: float) -> None:
        self.close(reservation_id, "settled", cost_usd)

    def keep(self, reservation_id: str, note: str = "") -> None:
        self.close(reservation_id, "kept", note=note)

    def release(self, reservation_id: str, note: str = "") -> None:
        self.close(reservation_id, "released", note=note)

    # -- reads (plain transactions: on SQLite/WAL they never block a writer)
    def _totals(self, scope: str, key: str) -> tuple[float, float, float, float, int]:
        row = self._tx(lambda c: c.one("SELECT hard_usd, open_usd, settled_usd, kept_usd, kept_calls FROM totals WHERE scope = ? AND key = ?",
                                       [scope, key]), write=False)
        if not row:
            return (0.0, 0.0, 0.0, 0.0, 0)
        # running sums of floats: drop the 1e-18 residue of adding and removing the same amounts
        return (*(round(float(v), 12) for v in row[:4]), int(row[4]))  # type: ignore[return-value]

    def spent(self, teacher: str) -> float:
        """Everything this teacher has cost or may have cost (settled + kept + in flight)."""
        hard, open_, *_ = self._totals("teacher", teacher)
        return max(0.0, float(hard) + float(open_))

    def remaining(self, teacher: str, budget: float) -> float:
        return max(0.0, budget - self.spent(teacher))

    def room(self, teacher: str, budget: float) -> float:
        """What may still be spent once the calls in flight settle (budget − settled − kept): what a plan can
        count on, since a reservation waits for money in flight instead of failing."""
        hard, *_ = self._totals("teacher", teacher)
        return max(0.0, budget - float(hard))

    def balance(self, teacher: str, budget_usd: float) -> Balance:
        hard, open_, settled, kept, kept_calls = self._totals("teacher", teacher)
        open_ = max(0.0, float(open_))
        spent = float(hard) + open_
        return Balance(teacher, float(budget_usd), spent, float(settled), float(kept), open_, max(0.0, budget_usd - spent), int(kept_calls))

    def spend_by_run(self, run_id: str) -> dict[str, float]:
        """USD per teacher committed by one run (settled, kept and still-open reservations)."""
        q = ("SELECT teacher, SUM(CASE state WHEN 'settled' THEN cost_usd WHEN 'released' THEN 0 ELSE reserved_usd END) "
             "FROM reservations WHERE run_id = ? GROUP BY teacher ORDER BY teacher")
        return {t: float(s or 0) for t, s in self._tx(lambda c: c.all(q, [run_id]), write=False)}

    def open_reservations(self) -> int:
        return int(self._tx(lambda c: c.one("SELECT COUNT(*) FROM reservations WHERE state IN ('reserved', 'sent')")[0], write=False))

    def rows(self, table: str = "reservations") -> list[dict[str, Any]]:
        """Every row of one ledger table (for audits and tests)."""
        if table not in ("reservations", "claims", "runs", "totals", "waiters", "teacher_identities", "billed_usage"):
            raise ValueError(f"no ledger table {table!r}")
        order = {"reservations": "created_at, id", "claims": "created_at, call_id", "runs": "started_at, run_id",
                 "totals": "scope, key", "waiters": "created_at, id", "teacher_identities": "teacher",
                 "billed_usage": "created_at, reservation_id"}[table]

        def run(c: _Cursor):
            cur = c.execute(f"SELECT * FROM {table} ORDER BY {order}")
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, r)) for r in cur.fetchall()]

        return self._tx(run, write=False)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


class _Cursor:
    """A DB-API cursor that speaks ``?`` placeholders on both backends."""

    def __init__(self, cur, db):
        self.cur, self.db = cur, db

    def execute(self, q: str, params: list | tuple = ()):
        self.cur.execute(self.db.sql(q), tuple(params))
        return self.cur

    def one(self, q: str, params: list | tuple = ()):
        return self.execute(q, params).fetchone()

    def all(self, q: str, params: list | tuple = ()):
        return self.execute(q, params).fetchall()


# ----------------------------------------------------------------------------------------------
class AsyncLedger:
    """The ledger as seen by one asyncio run: one worker thread (one connection) for its writes, a
    heartbeat task for its lease, waits that poll with backoff, and one batched poller for answers
    other runs are buying."""

    def __init__(self, ledger: Ledger, run_id: str, lease_s: float = DEFAULT_LEASE_S):
        self.ledger, self.run_id, self.lease_s = ledger, run_id, float(lease_s)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger")
        self._heart: asyncio.Task | None = None
        self._last_reconcile = 0.0
        self._watch: dict[str, asyncio.Future] = {}
        self._watcher: asyncio.Task | None = None
        self.lease_lost = False
        self.waits = 0  # reservations that had to wait for money in flight (not failures)

    async def _run(self, fn, *args, **kw):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kw))

    async def start(self) -> None:
        await self._run(self.ledger.start_run, self.run_id, self.lease_s)
        # a killed run's reservations stop counting now (its process is gone, or its lease expired), not only
        # once this run has to wait for money
        self._last_reconcile = time.monotonic()
        await self._run(self.ledger.reconcile)
        self._heart = asyncio.create_task(self._heartbeat())

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(max(0.2, self.lease_s / 4))
            try:
                if not await self._run(self.ledger.heartbeat, self.run_id):
                    self.lease_lost = True  # finalized by someone else: re-register; its open money was already settled safely
                    await self._run(self.ledger.start_run, self.run_id, self.lease_s)
            except LedgerError:
                pass  # the next beat tries again; the lease is long enough to miss a few

    async def maybe_reconcile(self) -> None:
        now = time.monotonic()
        if now - self._last_reconcile >= max(0.5, min(self.lease_s / 4, 5.0)):
            self._last_reconcile = now
            await self._run(self.ledger.reconcile)

    async def claim(self, call_id: str, teacher: str) -> Claim:
        """Claim ``call_id``; while a live run is buying it, wait, then take its answer (or the claim)."""
        while True:
            got = await self._run(self.ledger.claim, call_id, teacher, self.run_id)
            if got.state != "wait":
                return got
            fut = self._watch.get(call_id)
            if fut is None:
                fut = self._watch[call_id] = asyncio.get_running_loop().create_future()
            if self._watcher is None or self._watcher.done():
                self._watcher = asyncio.create_task(self._watch_claims())
            await asyncio.shield(fut)

    async def _watch_claims(self) -> None:
        """Poll the claims waited for. A ledger error (its server gone past ``outage_s``: each poll already
        rode through the outage) is handed to every waiter, so no wait stays pending forever."""
        delay = 0.02
        while self._watch:
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.25)
            ids = list(self._watch)
            try:
                status = await self._run(self.ledger.claims_status, ids)
                await self.maybe_reconcile()  # a claimant whose lease expired, or whose process is gone, is finalized
            except Exception as e:
                for cid in ids:
                    fut = self._watch.pop(cid, None)
                    if fut is not None and not fut.done():
                        fut.set_exception(e)
                continue
            for cid, s in status.items():
                if s != "inflight":
                    fut = self._watch.pop(cid, None)
                    if fut is not None and not fut.done():
                        fut.set_result(s)
                        delay = 0.02

    async def reserve(self, op: Reserve) -> Reservation:
        """Reserve the worst case, waiting while money in flight (anyone's) or earlier waiters are in the way."""
        waiter = uuid.uuid4().hex
        delay = 0.005
        waited = False
        while True:
            res = await self._run(self.ledger.try_reserve, op, waiter)
            if not res.wait:
                return res
            if not waited:
                waited = True
                self.waits += 1
            await self.maybe_reconcile()  # a dead run's reservations stop blocking once its lease expires
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 1.6, 0.2)

    async def mark_sent(self, reservation_id: str) -> None:
        await self._run(self.ledger.mark_sent, reservation_id)

    async def close(self, reservation_id: str, state: str, cost_usd: float | None = None, note: str = "",
                    answer: tuple[str, dict[str, Any]] | None = None, usage: dict[str, Any] | None = None) -> None:
        await self._run(self.ledger.close, reservation_id, state, cost_usd, note, answer, usage)

    async def fail_claim(self, call_id: str, reason: str) -> None:
        await self._run(self.ledger.fail_claim, call_id, self.run_id, reason)

    async def answer(self, call_id: str) -> dict[str, Any] | None:
        return await self._run(self.ledger.answer, call_id)

    async def finish(self, note: str = "run ended") -> dict[str, int]:
        """Stop heartbeating and close the run (anything still open is finalized: released or kept)."""
        for t in (self._heart, self._watcher):
            if t is not None:
                t.cancel()
        try:
            return await self._run(self.ledger.close_run, self.run_id, note)
        finally:
            self._pool.shutdown(wait=False)


def default_ledger_url() -> str:
    """``$COMPOSER_LEDGER_URL``, else ``<home>/ledger.sqlite`` (the one rule: :func:`composer_pipeline.home.default_ledger_url`)."""
    return home.default_ledger_url()


def open_ledger(url: str | Path | None = None) -> Ledger:
    return Ledger(url or default_ledger_url())
