"""`sql`'s limits against a hostile query: DuckDB's temp directory is private, a query has a time limit."""

import os

import pytest

from composer_pipeline.cli import main
from composer_pipeline.store import Store


def _store(root, t) -> str:
    s = Store(str(root))
    s.write_table("trace_states", t["trace_states"])
    s.write_table("trace_messages", t["trace_messages"])
    return str(root)


def test_the_temp_directory_in_the_working_directory_is_out_of_reach(tmp_path, session_tables, capsys, monkeypatch):
    """DuckDB's default temp directory is `<cwd>/.tmp`, reachable from queries even with external access
    off: a file there was read, and a query could write one."""
    root = _store(tmp_path / "store", session_tables)
    cwd = tmp_path / "cwd"
    (cwd / ".tmp").mkdir(parents=True)
    (cwd / ".tmp" / "notes.txt").write_text("private notes")
    monkeypatch.chdir(cwd)
    for q in (
        "select content from read_text('.tmp/notes.txt')",
        "select * from glob('.tmp/*')",
        "copy (select 42) to '.tmp/planted.csv'",
        f"select * from glob('{cwd}/.tmp/*')",
    ):
        capsys.readouterr()
        rc = main(["sql", q, "--store", root])
        out = capsys.readouterr()
        assert rc == 2, (q, out.out)
        assert "private notes" not in out.out and "notes.txt" not in out.out
        assert "refused:" in out.err, (q, out.err)
    assert sorted(os.listdir(cwd / ".tmp")) == ["notes.txt"]
    # the query's own temp directory is private and gone afterwards
    capsys.readouterr()
    assert main(["sql", "select current_setting('temp_directory') as d", "--store", root, "--json"]) == 0
    temp_dir = capsys.readouterr().out.split('"d":"')[1].split('"')[0]
    assert "composer-sql-" in temp_dir and not os.path.exists(temp_dir)


def test_a_query_over_the_time_limit_is_interrupted_with_a_clear_message(tmp_path, session_tables, capsys):
    root = _store(tmp_path / "store", session_tables)
    capsys.readouterr()
    rc = main(
        ["sql", "select count(*) from range(1000000000) a, range(1000000000) b", "--store", root, "--timeout-s", "0.5"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "query interrupted after 0.5 s" in err and "--timeout-s" in err
    # a query under the limit still answers
    assert main(["sql", "select count(*) from trace_states", "--store", root, "--timeout-s", "30"]) == 0
    assert "(1 row)" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "soon"])
def test_a_timeout_that_is_not_a_positive_number_is_refused_at_parsing(value, capsys):
    with pytest.raises(SystemExit) as e:
        main(["sql", "select 1", "--timeout-s", value])
    assert e.value.code == 2 and "--timeout-s" in capsys.readouterr().err
