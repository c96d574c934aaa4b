"""`training_set` gathers every session's pairs, also partitions materialized before the pair tables had
`partition_key`: those rows get the key their partition is stored under (the key the UI shows)."""

import dagster as dg
import pyarrow as pa

from assets.pairs import training_set
from assets.partitions import sessions_partitions
from composer_pipeline import tables
from composer_pipeline.store import Store
from resources.storage import ParquetIOManager
from tests.support.synthetic_train import pair_rows

OLD, NEW = "calc/a1f0c3d2", "calc/b2e1d4c3"


def test_training_set_fills_partition_key_of_partitions_written_before_it(tmp_path):
    store = Store(str(tmp_path / "store"))
    rows = pair_rows(6)
    pairs = tables.conform(pa.Table.from_pylist([r for r in rows if r["kind"] == "pair"]), "normalized_dpo_pairs")
    positives = tables.conform(
        pa.Table.from_pylist([{**r, "partition_key": NEW} for r in rows if r["kind"] == "positive"]),
        "agreement_positives",
    )
    store.write_table(
        "normalized_dpo_pairs", pairs.drop_columns(["partition_key"]), partition=OLD
    )  # an older version's file
    store.write_table("agreement_positives", positives, partition=NEW)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("sessions", [OLD, NEW])
    upstream = [
        dg.AssetSpec(name, partitions_def=sessions_partitions)
        for name in ("normalized_dpo_pairs", "agreement_positives")
    ]
    res = dg.materialize(
        [*upstream, training_set],
        selection=["training_set"],
        instance=instance,
        resources={"io_manager": ParquetIOManager(root=store.root)},
    )
    assert res.success
    ts = store.read_table("training_set")
    assert ts.num_rows == pairs.num_rows + positives.num_rows
    by_kind = {
        k: {p for p, kk in zip(ts.column("partition_key").to_pylist(), ts.column("kind").to_pylist()) if kk == k}
        for k in ("pair", "positive")
    }
    assert by_kind == {"pair": {OLD}, "positive": {NEW}}
