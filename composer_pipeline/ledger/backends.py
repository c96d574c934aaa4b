"""The ledger's two databases behind one transaction helper.

In:  a ledger URL: a file path (``sqlite:///`` prefix allowed) → an embedded SQLite file in WAL mode,
     ``postgresql://`` / ``postgres://`` → a PostgreSQL server through psycopg2.
Out: :class:`LedgerDatabase` (the base of :class:`~composer_pipeline.ledger.core.Ledger`): one connection
     per thread, :meth:`LedgerDatabase._tx` runs a function in one transaction through a :class:`Cursor` that speaks
     ``?`` placeholders on both backends; :class:`LedgerError` / :class:`LedgerUnavailable` naming the URL
     with its password removed (:func:`redact_url`, :func:`redact_url_secrets`).

Concurrency: SQLite serializes writers with ``BEGIN IMMEDIATE`` + ``busy_timeout`` (WAL: readers,
e.g. an auditor's connection held open, never block a writer); PostgreSQL transactions lock the rows they
decide on (``SELECT … FOR UPDATE``, written by the callers) and are retried on deadlock. A PostgreSQL server
lost after the ledger was opened (restart, stop, failover) is ridden through: each transaction reopens its
thread's connection and retries with backoff until ``outage_s`` (then :class:`LedgerUnavailable`).

Deliberately simplified: one connection per thread, no pool; SQLite admits one writing transaction at a
time across all processes (the ledger's transactions are short: bench/bench_ledger.py); a retried
transaction may repeat one whose COMMIT reached the server before the connection broke, so every write
made through :meth:`LedgerDatabase._tx` must be idempotent on retry or leave at worst a ``reserved`` row of its run.
"""

from __future__ import annotations

import os
import random
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote


class LedgerError(RuntimeError):
    """The ledger store cannot be opened or written (bad path, server down); names the URL, never a password."""


class LedgerUnavailable(LedgerError):
    """The ledger's server cannot be reached (refused, restarting, connection dropped). After the ledger was
    once opened, a transaction meeting it reconnects and retries until ``Ledger.outage_s`` has passed."""


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
    return user, password, rest[at + 1 :]


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

    found = [_userinfo(url.partition("://")[2])[1]]
    found += [m.group(0).split("=", 1)[1] for m in _URL_PASSWORD_RE.finditer(url)]
    out = set()
    for v in found:
        if v:
            out |= {v, unquote(v)}
    return sorted((v for v in out if v), key=len, reverse=True)


def redact_url_secrets(text: str, url: str) -> str:
    """``text`` (a driver's error message) without the URL's passwords, in any form the driver may echo them."""
    for v in url_secrets(url):
        text = text.replace(v, "***")
    # libpq quotes a malformed percent-escape it could not decode ("invalid percent-encoded token: \"p%zz\"")
    return re.sub(r'(invalid percent-encoded token:\s*)"[^"]*"', r'\1"***"', text)


def is_postgres(url: str) -> bool:
    return str(url).startswith(("postgresql://", "postgres://"))


class _SQLite:
    kind = "sqlite"
    now = "((julianday('now') - 2440587.5) * 86400.0)"
    for_update = ""
    # take the write lock up front: no lock upgrades, no deadlocks
    begin = "BEGIN IMMEDIATE"

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

        for attempt in range(50):
            con = None
            try:
                con = sqlite3.connect(str(self.path), timeout=120, isolation_level=None, check_same_thread=False)
                con.execute("PRAGMA busy_timeout = 120000")
                # switching a new file to WAL needs an exclusive lock and may answer "locked" at once while
                # another process creates the same file (the busy handler is not always used): retry
                con.execute("PRAGMA journal_mode = WAL")
                # WAL: durable across process crashes (kill -9)
                con.execute("PRAGMA synchronous = NORMAL")
                return con
            except sqlite3.DatabaseError as e:
                if con is not None:
                    con.close()
                if self.retryable(e) and attempt < 49:
                    time.sleep(random.uniform(0.01, 0.05) * min(attempt + 1, 10))
                    continue
                if "not a database" in str(e) and self._is_duckdb():
                    raise LedgerError(
                        f"ledger {self.path} is a DuckDB ledger of an earlier version: point the ledger at "
                        f"{self.path.with_suffix('.sqlite')} (its spend is imported from this file on first use)"
                    ) from None
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
        raise LedgerError(
            f"ledger {self.path}: its write-ahead log was deleted or replaced while this process had it open, "
            "so writes since then are lost to other processes; something in this process opened and closed "
            "the database file directly (that drops SQLite's locks). Stop this run and re-run it."
        )

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
        return isinstance(e, sqlite3.OperationalError) and "locked" in str(e)

    def migration_lock(self, cur) -> None:
        # BEGIN IMMEDIATE already excludes every other writer
        pass

    def disconnected(self, e: BaseException) -> bool:
        # an embedded file has no connection to lose
        return False

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
        if any(c in _userinfo(url.partition("://")[2])[1] for c in "/?#"):
            # libpq ends the host part there and quotes what it took for a port: the password's start
            raise LedgerError(
                f"ledger {self.label}: the password holds a raw '/', '?' or '#'; percent-encode it "
                "(%2F, %3F, %23) so the URL keeps it whole"
            )

    def connect(self):
        import psycopg2

        try:
            # keepalives: a server that vanished without closing the socket is noticed within ~25 s, not hours
            con = psycopg2.connect(
                self.url,
                connect_timeout=10,
                keepalives=1,
                keepalives_idle=10,
                keepalives_interval=5,
                keepalives_count=3,
            )
        # refused, starting up, shutting down: may pass
        except psycopg2.OperationalError as e:
            raise LedgerUnavailable(f"ledger {self.label}: cannot connect: {self.reason(e)}") from None
        except psycopg2.Error as e:
            raise LedgerError(f"ledger {self.label}: cannot connect: {self.reason(e)}") from None
        # transactions are explicit BEGIN/COMMIT, as on SQLite
        con.autocommit = True
        return con

    def reason(self, e: BaseException) -> str:
        """First line of a driver error, without any password of the URL."""
        text = str(e).strip()
        return redact_url_secrets(text.splitlines()[0], self.url) if text else type(e).__name__

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


class Cursor:
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


class LedgerDatabase:
    """One ledger database (file path → SQLite, ``postgresql://`` → PostgreSQL): a connection per thread and
    transactions retried through lock contention and server outages; thread-safe."""

    def __init__(self, url: str | Path, *, outage_s: float):
        url = str(url)
        self.url = url
        self._db = _Postgres(url) if is_postgres(url) else _SQLite(url)
        self._local = threading.local()
        # how long a transaction rides through a lost server before it fails
        self.outage_s = float(outage_s)
        # a server unreachable at open is an error at once; once the subclass has opened it (Ledger: schema in place), an outage to ride through
        self._opened = False
        # monotonic time the current outage began (shared by all threads)
        self._outage_since: float | None = None

    @property
    def label(self) -> str:
        """Where the ledger is, password removed."""
        return self._db.label

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
                    out = fn(Cursor(cur, self._db))
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
                    # one deadline per outage, not per transaction
                    outage_until = self._outage_since + self.outage_s
                    if now < outage_until:
                        time.sleep(min(pause, outage_until - now) * random.uniform(0.5, 1.0))
                        pause = min(pause * 2, 1.0)
                        continue
                    why = str(e).split(": ", 1)[-1] if isinstance(e, LedgerError) else self._reason(e)
                    raise LedgerUnavailable(
                        f"ledger {self.label}: unreachable for {self.outage_s:g}s ({why}); "
                        "this run stops. Its reservations are finalized by the next replay or "
                        "`composer-pipeline teachers reconcile` once the server is back"
                    ) from None
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
        return redact_url_secrets(text, self.url)
