"""Parquet storage for asset outputs: a UPath IO manager plus a ``Store`` resource.

In: ``pyarrow.Table`` asset outputs. Out: Parquet files laid out exactly as
``composer_pipeline.store.Store`` reads them:

* partitioned asset   -> ``<root>/<asset_name>/<partition_key>.parquet`` (a session's short key
  ``<project>/<id>`` is a folder per project)
* unpartitioned asset -> ``<root>/<asset_name>.parquet``

``root`` is a local directory or an ``s3://bucket/prefix`` (s3fs, which honours
``AWS_ENDPOINT_URL``). Assets that return ``None`` (checkpoints written elsewhere) write nothing.
Simplified: one file per partition (no row-group tuning, no schema evolution beyond pyarrow's
``promote_options``); missing upstream partitions are skipped only where the input asks for it
(``allow_missing_partitions``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
from upath import UPath

from composer_pipeline.store import Store, open_replacing, read_parquet


def _upath(root: str) -> UPath:
    if "://" in root:
        return UPath(root)
    return UPath(str(Path(root).expanduser().resolve()))


class ParquetUPathIOManager(dg.UPathIOManager):
    """Reads/writes ``pyarrow.Table`` as zstd Parquet under a local or ``s3://`` base path."""

    extension = ".parquet"

    def make_safe_partition_path(self, base_path: UPath, partition: str) -> UPath:
        # a session key is one file name; a short key <project>/<id> is a folder and a file name
        parts = partition.split("/")
        if len(parts) > 2 or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"partition key {partition!r} cannot be a file name")
        return base_path.joinpath(*parts)

    def dump_to_path(self, context: dg.OutputContext, obj: Any, path: UPath) -> None:
        if obj is None:
            return
        if not isinstance(obj, pa.Table):
            raise TypeError(f"{context.asset_key.to_user_string()}: expected a pyarrow.Table, got {type(obj).__name__}")
        # written whole or not at all: a failed write leaves the previous partition file as it was
        with open_replacing(path.fs, path.path, str(path)) as f:
            pq.write_table(obj, f, compression="zstd")

    def load_from_path(self, context: dg.InputContext, path: UPath) -> pa.Table:
        with path.open("rb") as f:
            return read_parquet(f, str(path))

    def load_input(self, context: dg.InputContext) -> Any:
        # An unpartitioned asset reading a partitioned one (training_set <- every session) always
        # gets ``{partition_key: Table}``: the base class hands back a bare Table when exactly one
        # partition exists and None when there are none, which breaks a ``dict`` input.
        if context.has_asset_key and context.has_asset_partitions and not context.has_partition_key:
            keys = context.asset_partition_keys
            paths = self._get_paths_for_partitions(context) if keys else {}
            loaded = {k: self._load_partition_from_path(context, k, paths[k], None) for k in keys}
            return {k: v for k, v in loaded.items() if v is not None}  # missing ones tolerated by metadata
        return super().load_input(context)

    def get_metadata(self, context: dg.OutputContext, obj: Any) -> dict[str, Any]:
        if isinstance(obj, pa.Table):
            return {"dagster/row_count": obj.num_rows, "bytes_in_memory": obj.nbytes}
        return {}

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        # nothing to store (e.g. a checkpoint written by the asset itself)
        if obj is None:
            return
        super().handle_output(context, obj)


class ParquetIOManager(dg.ConfigurableIOManagerFactory):
    """Parquet IO manager factory: ``root`` is a local directory or ``s3://bucket/prefix``."""

    root: str

    def create_io_manager(self, context) -> ParquetUPathIOManager:
        return ParquetUPathIOManager(base_path=_upath(self.root))


class StoreResource(dg.ConfigurableResource):
    """The same root as a ``Store`` (DuckDB views, lineage, uploads of checkpoints)."""

    root: str

    def store(self) -> Store:
        root = self.root if "://" in self.root else str(Path(self.root).expanduser().resolve())
        return Store(root)

    def upload_dir(self, local_dir: str | Path, name: str) -> str:
        """Copy a local directory to ``<root>/<name>/`` (no-op copy for a local root); returns its URL."""
        store = self.store()
        dest = store.path(name)
        local_dir = Path(local_dir)
        if not store.is_remote and Path(dest).resolve() == local_dir.resolve():
            return dest
        for p in sorted(local_dir.rglob("*")):
            if p.is_file():
                target = f"{dest}/{p.relative_to(local_dir).as_posix()}"
                store.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
                store.fs.put_file(str(p), target)
        return store.url(name)
