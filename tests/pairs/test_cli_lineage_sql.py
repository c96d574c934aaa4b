"""`pairs`, `lineage` and `sql` end to end through the CLI, on a local dir and on S3 (moto on 127.0.0.1)."""

import csv
import io

import orjson
import pytest

from composer_pipeline.cli import main
from composer_pipeline.lineage import format_lineage, resolve_pair_id, trace_pair
from composer_pipeline.store import Store


def _seed(root: str, t) -> Store:
    s = Store(root)
    s.write_table("trace_states", t["trace_states"])
    s.write_table("trace_messages", t["trace_messages"])
    s.write_table("replays", t["teacher_replays"])
    return s


def _run(capsys, *argv) -> str:
    capsys.readouterr()
    rc = main(list(argv))
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out.out


def _pairs_then_lineage_and_sql(root: str, t, capsys):
    store = _seed(root, t)
    summary = orjson.loads(
        _run(capsys, "pairs", "--replays", root, "--states", root, "--out", root).strip().splitlines()[-1]
    )
    assert summary["pairs"] == 1 and summary["positives"] == 1 and summary["dropped"] == 0
    assert summary["dropped_by_op"] == {} and summary["build"]["states"] == 3
    for name in ("dpo_pairs", "normalized_dpo_pairs", "agreement_positives", "dropped_pairs"):
        assert store.exists(name), name
    pid = store.read_table("normalized_dpo_pairs").column("pair_id")[0].as_py()

    # lineage by an 8-char prefix, machine-readable
    chain = orjson.loads(_run(capsys, "lineage", pid[:8], "--store", root, "--json"))
    assert chain["pair"]["pair_id"] == pid and chain["pair"]["tables"][0] == {
        "table": "normalized_dpo_pairs",
        "status": "kept",
    }
    assert sorted(r["teacher"] for r in chain["replays"]) == ["alpha", "alpha", "beta", "delta", "gamma"]
    assert chain["state"]["state_id"] == "s_bash_000000000002" and chain["state"]["stream_id"] == "proj__s1:main"
    assert chain["session"] == {"session_key": "proj__s1", "session_id": "sess-1", "source_file": "proj/s1.jsonl"}
    (rec,) = chain["records"]
    assert (rec["source_file"], rec["line_no"], rec["uuid"], rec["uuid_matches"]) == ("proj/s1.jsonl", 4, "a2", True)
    assert orjson.loads(rec["raw"])["message"]["content"][0]["input"] == {"command": "pytest -q"}
    assert chain["missing"] == []
    text = _run(capsys, "lineage", pid, "--store", root)
    assert "line 4  assistant  uuid=a2" in text and '"pytest -q"' in text
    # which kind of agreement, in words, and the consensus itself (not only its signature)
    assert "agreement cross_model: 2 of 3 models" in text and chain["pair"]["agreement_kind"] == "cross_model"
    consensus = text.split("  consensus: ", 1)[1]
    assert consensus.splitlines()[1].startswith("    │ ") and '"Edit"' in consensus.split("  agent:", 1)[0]

    # sql over the stored tables, three output forms
    q = "select pair_id, n_agreeing, agreeing_teachers from normalized_dpo_pairs"
    rows = orjson.loads(_run(capsys, "sql", q, "--store", root, "--json"))
    assert rows == [{"pair_id": pid, "n_agreeing": 2, "agreeing_teachers": ["alpha", "beta"]}]
    got = list(
        csv.reader(
            io.StringIO(
                _run(
                    capsys,
                    "sql",
                    "select state_id, teacher from teacher_replays order by 1, 2",
                    "--store",
                    root,
                    "--csv",
                )
            )
        )
    )
    assert got[0] == ["state_id", "teacher"] and len(got) == 12
    table = _run(capsys, "sql", "select kind, count(*) as n from agreement_positives group by kind", "--store", root)
    assert "positive" in table and "(1 row)" in table
    # the message payload, stored once inside raw, is offered by the view as JSON columns
    q = "select line_no, content, tool_use_result from trace_messages where record_type = 'user' order by line_no"
    rows = orjson.loads(_run(capsys, "sql", q, "--store", root, "--json"))
    assert orjson.loads(rows[0]["content"]) == "Please fix the failing test in src/app.py"
    assert orjson.loads(rows[1]["content"])[0]["tool_use_id"] == "toolu_1" and rows[1]["tool_use_result"] is None
    _sql_is_read_only(root, store, capsys)
    return store, pid


# each wrote, read or fetched outside the store (COPY overwrote trace_states.parquet: 173 -> 1 rows)
HOSTILE_SQL = [
    "COPY (select 1 as x) TO '{root}/trace_states.parquet' (FORMAT parquet)",
    "EXPORT DATABASE '{root}/export'",
    "select * from read_text('/etc/passwd')",
    "select * from read_parquet('{root}/trace_states.parquet')",
    "ATTACH '{root}/ledger.sqlite' (TYPE sqlite)",
    "select * from read_csv('https://example.com/x.csv')",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "SET autoinstall_known_extensions = true",
]


def _sql_is_read_only(root: str, store: Store, capsys) -> None:
    before = {p: store.fs.cat_file(p) for p in store.fs.find(store.base)}
    for q in HOSTILE_SQL:
        capsys.readouterr()
        assert main(["sql", q.format(root=root), "--store", root]) == 2, q
        err = capsys.readouterr().err
        assert "refused:" in err and "reads the stored tables only" in err, (q, err)
    assert {p: store.fs.cat_file(p) for p in store.fs.find(store.base)} == before
    assert "(1 row)" in _run(capsys, "sql", "select count(*) from trace_states", "--store", root)


@pytest.mark.slow
def test_local_end_to_end(tmp_path, session_tables, capsys):
    store, _ = _pairs_then_lineage_and_sql(str(tmp_path / "run"), session_tables, capsys)
    pos = store.read_table("agreement_positives").column("pair_id")[0].as_py()
    chain = trace_pair(store, pos)
    assert chain["pair"]["tables"] == [{"table": "agreement_positives", "status": "positive"}]
    assert [r["line_no"] for r in chain["records"]] == [2] and chain["records"][0]["uuid"] == "a1"


@pytest.mark.slow
def test_s3_end_to_end(moto_s3, session_tables, capsys):
    store, pid = _pairs_then_lineage_and_sql("s3://pairs-test/run1", session_tables, capsys)
    assert store.is_remote and store.fs.exists("pairs-test/run1/pairs.parquet")


def test_dropped_pair_traces_to_its_drop_reason(tmp_path, session_tables, capsys, repo_root):
    root = str(tmp_path / "run")
    _seed(root, session_tables)
    recipe = tmp_path / "strict.yaml"
    recipe.write_text("process:\n  - text_length_filter:\n      text_key: rejected_text\n      min_len: 1000\n")
    summary = orjson.loads(
        _run(capsys, "pairs", "--replays", root, "--states", root, "--out", root, "--normalize-recipe", str(recipe))
    )
    assert summary["pairs"] == 0 and summary["dropped_by_op"] == {"text_length_filter": 1}
    pid = Store(root).read_table("dropped_pairs").column("pair_id")[0].as_py()
    chain = trace_pair(Store(root), pid[:6])
    assert [a["status"] for a in chain["pair"]["tables"]] == ["dropped", "built"]
    assert "dropped by text_length_filter: rejected_text: text_len=" in format_lineage(chain)


def test_lineage_errors_are_clear(tmp_path, session_tables, capsys):
    root = str(tmp_path / "run")
    _seed(root, session_tables)
    _run(capsys, "pairs", "--replays", root, "--states", root, "--out", root)
    with pytest.raises(ValueError, match="at least 6"):
        resolve_pair_id(Store(root), "abc")
    with pytest.raises(ValueError, match="no pair with id"):
        resolve_pair_id(Store(root), "zzzzzzzz")
    assert main(["lineage", "zzzzzzzz", "--store", root]) == 2
    assert "no pair with id" in capsys.readouterr().err
    # a second pair table with an id sharing the prefix makes it ambiguous
    import pyarrow as pa

    s = Store(root)
    t = s.read_table("dpo_pairs")
    pid = t.column("pair_id")[0].as_py()
    rows = t.to_pylist()
    rows[0]["pair_id"] = pid[:6] + "0" * 14 if pid[6] != "0" else pid[:6] + "1" * 14
    Store(str(tmp_path / "other")).write_table("dpo_pairs", pa.Table.from_pylist(rows, schema=t.schema))
    with pytest.raises(ValueError, match="ambiguous"):
        resolve_pair_id([s, Store(str(tmp_path / "other"))], pid[:6])
    # missing upstream tables are reported, not skipped
    Store(str(tmp_path / "only")).write_table("pairs", s.read_table("normalized_dpo_pairs"))
    chain = trace_pair(Store(str(tmp_path / "only")), pid)
    assert "trace_states: table not stored" in chain["missing"] and chain["records"] == []
    assert main(["sql", "select * from nope", "--store", root]) == 2
    assert "normalized_dpo_pairs" in capsys.readouterr().err


def test_a_truncated_parquet_file_is_named_in_the_error(tmp_path, session_tables, capsys):
    store = _seed(str(tmp_path / "run"), session_tables)
    (path,) = store.files("trace_states")
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])  # a write cut short
    capsys.readouterr()
    assert main(["sql", "select count(*) from trace_states", "--store", store.root]) == 2
    err = capsys.readouterr().err
    assert f"{path}: not a readable Parquet file" in err and "<Buffer>" not in err


def test_show_lineage_sql_default_to_the_demo_and_dagster_store(tmp_path, session_tables, capsys, monkeypatch):
    """Run from the repo root without --store, they read .store (where the demo and Dagster write)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COMPOSER_STORE", raising=False)
    root = str(tmp_path / ".store")
    _seed(root, session_tables)
    _run(capsys, "pairs", "--replays", root, "--states", root, "--out", root)
    pid = Store(root).read_table("normalized_dpo_pairs").column("pair_id")[0].as_py()
    assert pid in _run(capsys, "sql", "select pair_id from normalized_dpo_pairs")
    assert f"pair {pid}" in _run(capsys, "lineage", pid)
    assert f"pair {pid}" in _run(capsys, "show", pid, "--width", "120")
    monkeypatch.setenv("COMPOSER_STORE", str(tmp_path / "elsewhere"))  # the variable still wins
    capsys.readouterr()
    assert main(["lineage", pid]) == 2


def test_the_short_partition_key_in_the_pair_tables_lineage_and_sql(tmp_path, session_tables, capsys):
    """The key the Dagster UI shows (`proj/s1` for session `proj__s1`) is a column of every pair table, names
    the session in `lineage` (every pair of it) and in `sql` (`session_of`, the `sessions` view)."""
    root = str(tmp_path / "run")
    store = _seed(root, session_tables)
    _run(capsys, "pairs", "--replays", root, "--states", root, "--out", root)
    for name in ("dpo_pairs", "normalized_dpo_pairs", "agreement_positives"):
        t = store.read_table(name)
        names = t.column_names
        assert names[names.index("session_key") + 1] == "partition_key", name  # beside the long key
        assert set(t.column("partition_key").to_pylist()) == {"proj/s1"}, name
    pairs = [
        p
        for name in ("normalized_dpo_pairs", "agreement_positives")
        for p in store.read_table(name).column("pair_id").to_pylist()
    ]
    assert len(pairs) == 2

    chains = orjson.loads(_run(capsys, "lineage", "proj/s1", "--store", root, "--json"))
    assert sorted(c["pair"]["pair_id"] for c in chains) == sorted(pairs)  # one chain per pair of the session
    assert {c["session"]["session_key"] for c in chains} == {"proj__s1"}
    by_long = orjson.loads(_run(capsys, "lineage", "--store", root, "--json", "--", "proj__s1"))
    assert by_long == chains
    text = _run(capsys, "lineage", "proj/s1", "--store", root)
    assert all(f"pair {p}" in text for p in pairs)
    one = orjson.loads(_run(capsys, "lineage", pairs[0], "--store", root, "--json"))
    # a pair id still prints one chain object
    assert one["pair"]["pair_id"] == pairs[0]
    assert main(["lineage", "proj/zz", "--store", root]) == 2
    assert "no session with partition key 'proj/zz'" in capsys.readouterr().err

    rows = orjson.loads(_run(capsys, "sql", "select * from sessions", "--store", root, "--json"))
    assert rows == [{"session_key": "proj__s1", "partition_key": "proj/s1"}]
    q = "select count(*) as n from trace_states where session_key = session_of('proj/s1')"
    assert orjson.loads(_run(capsys, "sql", q, "--store", root, "--json")) == [{"n": 3}]
    q = "select distinct partition_of(session_key) as k from teacher_replays"
    assert orjson.loads(_run(capsys, "sql", q, "--store", root, "--json")) == [{"k": "proj/s1"}]
    q = "select pair_id from dpo_pairs where partition_key = 'proj/s1'"
    assert (
        len(orjson.loads(_run(capsys, "sql", q, "--store", root, "--json"))) == store.read_table("dpo_pairs").num_rows
    )
    assert main(["sql", "select session_of('proj/zz')", "--store", root]) == 2
    assert "no session with partition key or session key proj/zz" in capsys.readouterr().err


def test_pair_tables_written_before_partition_key_still_normalize_and_show_it(tmp_path, session_tables, capsys):
    """A dpo_pairs table from before the column: normalize fills it from the session key; a stored key wins."""
    from composer_pipeline.ids import with_partition_key
    from composer_pipeline.pairs.normalize import normalize_pairs

    root = str(tmp_path / "run")
    store = _seed(root, session_tables)
    _run(capsys, "pairs", "--replays", root, "--states", root, "--out", root)
    old = store.read_table("dpo_pairs").drop_columns(["partition_key"])
    kept = normalize_pairs(old).kept
    assert kept.num_rows == old.num_rows and set(kept.column("partition_key").to_pylist()) == {"proj/s1"}
    named = with_partition_key(old, {"proj__s1": "proj/s1-named-by-dagster"})
    assert set(named.column("partition_key").to_pylist()) == {"proj/s1-named-by-dagster"}
    assert with_partition_key(named).equals(named)  # filled keys are kept as stored
