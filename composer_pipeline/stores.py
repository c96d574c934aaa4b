"""Several stores read as one: the multi-store read behind ``show`` and ``lineage`` (``--store`` repeated).

In:  stores (:class:`~composer_pipeline.store.Store`, or roots: a directory or an ``s3://`` prefix);
     a table name; optionally a column and the values (or one prefix) its rows must have.
Out: :class:`Stores`: the table concatenated across every store that holds it (``None`` when none
     does: the caller says what is missing, in its words), and :attr:`Stores.where`, the roots as the
     error messages of both commands name them.

Deliberately simplified: each table is read whole, then filtered in memory (fine to a few million rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from composer_pipeline.store import Store


def rows_where(table: pa.Table, column: str, values: Sequence[str], *, prefix: bool = False) -> pa.Table:
    """Rows of ``table`` whose ``column`` is one of ``values`` (``prefix``: starts with ``values[0]``);
    no values, no rows."""
    if not values:
        return table.slice(0, 0)
    col = table.column(column)
    mask = pc.starts_with(col, values[0]) if prefix else pc.is_in(col, pa.array(list(values), col.type))
    return table.filter(pc.fill_null(mask, False))


@dataclass(frozen=True)
class Stores:
    """The stores a command was given, read as one."""

    stores: tuple[Store, ...]

    @classmethod
    def of(cls, store: Stores | Store | str | Sequence[Store | str]) -> Stores:
        if isinstance(store, Stores):
            return store
        items = [store] if isinstance(store, (Store, str)) else list(store)
        return cls(tuple(s if isinstance(s, Store) else Store(s) for s in items))

    @property
    def where(self) -> str:
        """The roots, as every error of ``show`` and ``lineage`` names them."""
        return ", ".join(s.root for s in self.stores)

    def has(self, name: str) -> bool:
        return any(s.exists(name) for s in self.stores)

    def read(
        self,
        name: str,
        column: str | None = None,
        values: Sequence[str] = (),
        *,
        prefix: bool = False,
        columns: Sequence[str] | None = None,
    ) -> pa.Table | None:
        """Table ``name`` from every store that holds it, concatenated (``None`` when none does); with
        ``column``, only the rows :func:`rows_where` keeps; with ``columns``, only those columns."""
        parts = [s.read_table(name, columns) for s in self.stores if s.exists(name)]
        if not parts:
            return None
        table = pa.concat_tables(parts, promote_options="default") if len(parts) > 1 else parts[0]
        return table if column is None else rows_where(table, column, values, prefix=prefix)
