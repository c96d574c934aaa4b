"""Where tables live: a local directory or an ``s3://`` prefix, read and written as Parquet.

Two layouts are read transparently, so every command works on what either front end wrote:

* flat, written by the CLI:            ``<root>/<name>.parquet`` (or an alias, e.g. ``replays.parquet``)
* partitioned, written by Dagster:     ``<root>/<name>/<partition_key>.parquet`` (UPath IO manager)

S3 goes through s3fs (which honours ``AWS_ENDPOINT_URL``); DuckDB never touches the network or any
file: tables are read with pyarrow and registered as views (no httpfs extension download needed), then
its external access is switched off (:meth:`Store.duckdb`: ``sql`` reads the stored tables only).

Every Parquet file is written whole or not at all (:func:`staged`): locally to a temporary file in the
same directory, renamed over the old one only once written and closed, so a failure (a full disk)
leaves the previous output as it was, and the error names the file. On S3 an object is replaced
only by a completed upload, so it is written in place.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import secrets
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from composer_pipeline import tables

if TYPE_CHECKING:
    import fsspec


# recipes/pipeline.yaml store_root: where the demo and the Dagster assets write
DEFAULT_STORE = ".store"


def default_store() -> str:
    """The store a command reads when given none: ``$COMPOSER_STORE``, else ``.store`` (relative to cwd)."""

    return os.environ.get("COMPOSER_STORE") or DEFAULT_STORE


def path_error(e: OSError, path: str) -> OSError:
    """``e`` naming ``path`` (pyarrow's write errors name no file: ``error:: No space left on device``)."""
    if getattr(e, "filename", None):
        return e
    return OSError(e.errno, e.strerror or str(e), path)


@contextlib.contextmanager
def staged(path: str) -> Iterator[str]:
    """A temporary path beside the local file ``path``; renamed to ``path`` when the block ends without
    an error, removed when it raises (the previous ``path`` stays whole). ``os.replace`` within one
    directory is atomic on POSIX."""
    d, name = os.path.split(path)
    tmp = os.path.join(d, f".{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    try:
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise path_error(e, path) from e


@contextlib.contextmanager
def open_replacing(fs: fsspec.AbstractFileSystem, path: str, where: str | None = None) -> Iterator[IO[bytes]]:
    """A binary file that replaces ``path`` on ``fs`` only once written whole (:func:`staged` locally; an
    object store's upload is all or nothing). An ``OSError`` names ``where`` (default ``path``)."""
    try:
        if _is_local(fs):
            with staged(path) as tmp, open(tmp, "wb") as f:
                yield f
        else:
            f = fs.open(path, "wb")
            try:
                yield f
            # not close(): that would upload what was written so far
            except BaseException:
                f.discard()  # (s3fs: aborts a multipart upload)
                f.closed = True
                raise
            f.close()
    except OSError as e:
        raise path_error(e, where or path) from e


def _is_local(fs) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def read_parquet(f, where: str, columns: Iterable[str] | None = None) -> pa.Table:
    """``pq.read_table`` whose error names the file: pyarrow's own says ``<Buffer>`` for an open file
    object, which leaves a user with a truncated or foreign file nothing to look for."""
    try:
        return pq.read_table(f, columns=list(columns) if columns else None)
    # not OSError: a network failure is not a damaged file
    except pa.ArrowInvalid as e:
        raise ValueError(
            f"{where}: not a readable Parquet file ({type(e).__name__}: "
            f"{str(e).replace('<Buffer>', 'the file')}); a write cut short? delete or rewrite it"
        ) from e


@dataclass
class Store:
    root: str
    fs: fsspec.AbstractFileSystem = field(init=False, repr=False)
    base: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # (here: `ingest` to a local directory uses only staged(), without fsspec's ~0.03 CPU-s import)
        import fsspec

        self.root = str(self.root).rstrip("/") or "/"
        self.fs, self.base = fsspec.core.url_to_fs(self.root)
        self.base = self.base.rstrip("/")

    # -- paths
    @property
    def is_remote(self) -> bool:
        return "://" in self.root and not self.root.startswith("file://")

    def path(self, *parts: str) -> str:
        return posixpath.join(self.base, *parts)

    def url(self, *parts: str) -> str:
        """A user-facing location (``s3://...`` or a local path)."""
        p = self.path(*parts)
        return f"{self.root.split('://', 1)[0]}://{p}" if self.is_remote else p

    def _user_path(self, p: str) -> str:
        """A file path as found by ``files`` (bucket/key for s3), the way a user would type it."""
        return f"{self.root.split('://', 1)[0]}://{p}" if self.is_remote else p

    def _candidates(self, name: str) -> list[str]:
        return [name, *tables.FILE_ALIASES.get(name, ())]

    # -- write
    def write_table(self, name: str, table: pa.Table, partition: str | None = None) -> str:
        path = self.path(name, f"{partition}.parquet") if partition else self.path(f"{name}.parquet")
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        with open_replacing(self.fs, path, self._user_path(path)) as f:
            pq.write_table(table, f, compression="zstd")
        return path

    # -- read
    def files(self, name: str) -> list[str]:
        """Parquet files holding table ``name`` (flat file first, then partitions, sorted)."""
        out: list[str] = []
        for cand in self._candidates(name):
            flat = self.path(f"{cand}.parquet")
            if self.fs.isfile(flat):
                out.append(flat)
            d = self.path(cand)
            if self.fs.isdir(d):
                out.extend(sorted(p for p in self.fs.find(d) if p.endswith(".parquet")))
        return out

    def exists(self, name: str) -> bool:
        return bool(self.files(name))

    def read_table(self, name: str, columns: Iterable[str] | None = None) -> pa.Table:
        files = self.files(name)
        if not files:
            if name in tables.SCHEMAS:
                t = tables.empty(name)
                return t.select(list(columns)) if columns else t
            raise FileNotFoundError(f"no table {name!r} under {self.root}")
        parts = []
        for p in files:
            with self.fs.open(p, "rb") as f:
                parts.append(read_parquet(f, self._user_path(p), columns))
        return pa.concat_tables(parts, promote_options="default") if len(parts) > 1 else parts[0]

    def table_names(self) -> list[str]:
        names = []
        for name in tables.SCHEMAS:
            if self.exists(name):
                names.append(name)
        # anything else stored (e.g. policy_eval metrics) is exposed too
        if self.fs.isdir(self.base):
            for p in self.fs.ls(self.base, detail=False):
                stem = posixpath.basename(p.rstrip("/"))
                stem = stem[: -len(".parquet")] if stem.endswith(".parquet") else stem
                canonical = next((k for k, v in tables.FILE_ALIASES.items() if stem in v), stem)
                if canonical not in names and self.files(canonical):
                    names.append(canonical)
        return names

    def duckdb(self, temp_directory: str | None = None):
        """An in-memory DuckDB connection with one view per stored table (named after the asset), that
        reads those views only: the tables are read here (pyarrow, s3fs for S3) and registered, then
        DuckDB's file system and network access is switched off and its configuration locked, so a query
        can neither write (``COPY ... TO``, ``EXPORT``), nor read other files (``read_text('/etc/passwd')``,
        ``ATTACH``), nor fetch or load extensions (``read_csv('https://...')``, ``INSTALL``), nor turn any
        of that back on (``SET``); it is refused with DuckDB's permission error.

        DuckDB keeps its temp directory (spilled data) reachable from queries even with external access
        off; its default is ``<cwd>/.tmp``, a folder of the user's. It is ``temp_directory`` instead, else a
        fresh private (0700) folder removed with the connection."""
        import duckdb

        own_temp = temp_directory is None
        temp = tempfile.mkdtemp(prefix="composer-duckdb-") if temp_directory is None else temp_directory
        con = duckdb.connect(
            config={
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
                "python_enable_replacements": False,
                "temp_directory": temp,
            }
        )  # (no Python variable is a table)
        if own_temp:
            weakref.finalize(con, shutil.rmtree, temp, True)
        for name in self.table_names():
            table = self.read_table(name)
            if name == "trace_messages" and "content" not in table.column_names:
                # the payload is stored once, inside raw: offer it as JSON columns too
                con.register("trace_messages_stored", table)
                con.execute(_MESSAGES_VIEW)
            else:
                con.register(name, table)
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        return con


# trace_messages as users query it: the stored columns plus ``content`` (message.content, or a system
# record's own content) and ``tool_use_result`` as JSON, read from ``raw`` (render.record_payload in SQL)
_MESSAGES_VIEW = """
CREATE VIEW trace_messages AS
SELECT *,
  CASE WHEN record_type <> 'damaged' AND json_valid(raw) THEN coalesce(
    json_extract(raw, '$.message.content'),
    CASE WHEN record_type = 'system' THEN json_extract(raw, '$.content') END) END AS content,
  CASE WHEN record_type <> 'damaged' AND json_valid(raw) THEN json_extract(raw, '$.toolUseResult') END
    AS tool_use_result
FROM trace_messages_stored
"""
