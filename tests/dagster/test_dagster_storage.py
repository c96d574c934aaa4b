"""The Parquet UPath IO manager: local and s3:// (moto's real S3-protocol server on 127.0.0.1)."""

import dagster as dg
import pyarrow as pa
import pytest

from composer_pipeline.store import Store
from resources.storage import ParquetIOManager

parts = dg.StaticPartitionsDefinition(["sess_a", "sess_b", "sess_c"])


@dg.asset(partitions_def=parts)
def rows(context: dg.AssetExecutionContext) -> pa.Table:
    return pa.table({"session_key": [context.partition_key] * 2, "n": [1, 2]})


@dg.asset(ins={"rows": dg.AssetIn(metadata={"allow_missing_partitions": True})})
def gathered(rows: dict) -> pa.Table:
    return pa.concat_tables([rows[k] for k in sorted(rows)])


one_session = dg.DynamicPartitionsDefinition(name="one_session")


@dg.asset(partitions_def=one_session)
def session_rows(context: dg.AssetExecutionContext) -> pa.Table:
    return pa.table({"session_key": [context.partition_key]})


@pytest.mark.parametrize("materialized", [True, False])
def test_unpartitioned_downstream_gets_a_dict_with_a_single_partition(tmp_path, materialized):
    """With exactly one session, the gathering asset still gets ``{key: Table}`` (or ``{}``), not a bare Table."""
    io = ParquetIOManager(root=str(tmp_path / "store"))
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("one_session", ["s1"])
    if materialized:
        assert dg.materialize(
            [session_rows], partition_key="s1", resources={"io_manager": io}, instance=instance
        ).success

    @dg.asset(ins={"session_rows": dg.AssetIn(metadata={"allow_missing_partitions": True})})
    def keys_seen(session_rows: dict) -> pa.Table:
        return pa.table({"key": pa.array(sorted(session_rows), pa.string())})

    res = dg.materialize([session_rows.to_source_asset(), keys_seen], resources={"io_manager": io}, instance=instance)
    assert res.success
    assert res.output_for_node("keys_seen").column("key").to_pylist() == (["s1"] if materialized else [])


def _roundtrip(root: str) -> Store:
    io = ParquetIOManager(root=root)
    instance = dg.DagsterInstance.ephemeral()
    # sess_b never materialized: tolerated downstream
    for key in ("sess_a", "sess_c"):
        assert dg.materialize([rows], partition_key=key, resources={"io_manager": io}, instance=instance).success
    res = dg.materialize([rows.to_source_asset(), gathered], resources={"io_manager": io}, instance=instance)
    assert res.success
    out = res.output_for_node("gathered")
    assert out.column("session_key").to_pylist() == ["sess_a", "sess_a", "sess_c", "sess_c"]
    return Store(root)


def test_parquet_io_manager_local_layout(tmp_path):
    store = _roundtrip(str(tmp_path / "store"))
    assert (tmp_path / "store" / "rows" / "sess_a.parquet").is_file()
    assert (tmp_path / "store" / "gathered.parquet").is_file()
    assert store.read_table("rows").num_rows == 4
    assert store.read_table("gathered").num_rows == 4


def test_parquet_io_manager_s3_roundtrip(moto_s3):
    store = _roundtrip("s3://composer-test/pipeline")
    assert store.is_remote
    assert sorted(p.rsplit("/", 1)[-1] for p in store.files("rows")) == ["sess_a.parquet", "sess_c.parquet"]
    assert store.fs.isfile("composer-test/pipeline/gathered.parquet")
    assert store.read_table("gathered").column("n").to_pylist() == [1, 2, 1, 2]


def test_store_resource_uploads_checkpoint_dir_to_s3(moto_s3, tmp_path):
    from resources.storage import StoreResource

    ckpt = tmp_path / "checkpoint"
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"\x00" * 1000)
    (ckpt / "sub" / "tokenizer.json").write_text('{"a": 1}')
    res = StoreResource(root="s3://composer-test/pipeline")
    url = res.upload_dir(ckpt, "checkpoints/run1")
    assert url == "s3://composer-test/pipeline/checkpoints/run1"
    fs = res.store().fs
    assert fs.cat("composer-test/pipeline/checkpoints/run1/sub/tokenizer.json") == b'{"a": 1}'
    assert fs.size("composer-test/pipeline/checkpoints/run1/model.safetensors") == 1000


def test_a_short_session_key_is_a_folder_per_project_and_the_gathering_asset_reads_both_forms(tmp_path):
    """`calc/a1f0c3d2` is stored as <asset>/calc/a1f0c3d2.parquet beside a long key's file (older
    instances); a key that would leave the asset's folder is refused."""
    from upath import UPath

    from resources.storage import ParquetUPathIOManager

    io = ParquetIOManager(root=str(tmp_path / "store"))
    instance = dg.DagsterInstance.ephemeral()
    keys = ["calc/a1f0c3d2", "-home-dev-calc__b2e1d4c3-2222-4b4b-8b8b-000000000002"]
    instance.add_dynamic_partitions("one_session", keys)
    for key in keys:
        assert dg.materialize(
            [session_rows], partition_key=key, resources={"io_manager": io}, instance=instance
        ).success
    assert (tmp_path / "store" / "session_rows" / "calc" / "a1f0c3d2.parquet").is_file()
    assert (tmp_path / "store" / "session_rows" / f"{keys[1]}.parquet").is_file()

    @dg.asset(ins={"session_rows": dg.AssetIn(metadata={"allow_missing_partitions": True})})
    def keys_seen(session_rows: dict) -> pa.Table:
        return pa.table({"key": pa.array(sorted(session_rows), pa.string())})

    res = dg.materialize([session_rows.to_source_asset(), keys_seen], resources={"io_manager": io}, instance=instance)
    assert res.output_for_node("keys_seen").column("key").to_pylist() == sorted(keys)
    assert sorted(
        Store(str(tmp_path / "store")).read_table("session_rows").column("session_key").to_pylist()
    ) == sorted(keys)
    manager = ParquetUPathIOManager(base_path=UPath(str(tmp_path)))
    for bad in ("../x", "a/../b", "a/b/c", "a/", ""):
        with pytest.raises(ValueError, match="cannot be a file name"):
            manager.make_safe_partition_path(UPath(str(tmp_path)), bad)
