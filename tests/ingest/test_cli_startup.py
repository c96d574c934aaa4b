"""What an `ingest` process loads besides ingest: every import is CPU of every run (issue 35 §4), so a
local `--out` loads neither fsspec nor the budget ledger (asyncio, decimal), nor ``pyarrow.compute``
(~0.03 CPU-s) nor numpy (~0.055 CPU-s; only the secret prefilter's RE2 fallback, where Hyperscan is
missing, needs either), and the ledger's errors still reach their exit codes from the commands that do
load it. Sessions the compiled engine reads whole load neither the Python engine nor the Codex reader
(nor msgspec), and a run builds the parser of its own subcommand only."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from composer_pipeline import cli
from composer_pipeline.ingest import native
from tests.support.sessions import Session, text


def test_ingest_to_a_local_directory_loads_neither_fsspec_nor_the_ledger_nor_arrow_compute_nor_numpy(
    tmp_path, repo_root
):
    samples = repo_root / "composer_pipeline" / "samples" / "projects"
    code = (
        "import sys\n"
        "from composer_pipeline.cli import main\n"
        f"rc = main(['ingest', {str(samples)!r}, '--out', {str(tmp_path / 'out')!r}])\n"
        "loaded = [m for m in ('fsspec', 'asyncio', 'composer_pipeline.ledger', 'pyarrow.compute', 'numpy') if m in sys.modules]\n"
        "print('LOADED', rc, loaded, file=sys.stderr)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "LOADED 0 []" in p.stderr, p.stderr
    assert {f.name for f in (tmp_path / "out").iterdir()} == {
        "trace_states.parquet",
        "trace_messages.parquet",
        "quarantine.parquet",
    }


@pytest.mark.parametrize(
    "error, rc",
    [("LedgerError", 2), ("ReplayInterrupted", 128 + signal.SIGTERM)],
)
def test_ledger_errors_keep_their_exit_codes(monkeypatch, capsys, error, rc):
    from composer_pipeline.ledger import LedgerError, ReplayInterrupted

    def run(args):
        raise LedgerError("the ledger is locked") if error == "LedgerError" else ReplayInterrupted(signal.SIGTERM)

    monkeypatch.setattr(cli.sql, "run", run)
    assert cli.main(["sql", "select 1"]) == rc
    err = capsys.readouterr().err
    assert err.startswith("composer-pipeline sql: ")
    assert ("the ledger is locked" if error == "LedgerError" else "interrupted by SIGTERM") in err


def test_ingest_without_numpy_writes_what_ingest_with_numpy_writes(tmp_path, repo_root):
    """The CLI loads pyarrow without numpy (``load_arrow_without_numpy``): the same Parquet rows as an
    in-process run (this test's pyarrow has numpy) from both engines, Codex rollouts, a session the
    compiled engine hands to Python (invalid UTF-8) and the secret prefilter's RE2 fallback."""
    import shutil

    import pyarrow.parquet as pq

    from composer_pipeline.ingest import native

    from . import codex_fixtures

    root = tmp_path / "root"
    shutil.copytree(repo_root / "composer_pipeline" / "samples" / "projects", root / "claude")
    for generation in codex_fixtures.GENERATIONS:
        codex_fixtures.write(root / "codex", generation)
    bad = root / "claude" / "bad" / "s.jsonl"
    bad.parent.mkdir()
    bad.write_bytes(
        b'{"type":"user","uuid":"u-1","message":{"role":"user","content":"hi"}}\n{"type":"user","uuid":"u-bad","parentUuid":"u-1","cwd":"\xff"}\n'
    )
    line = b'{"t":"x"}\n{"k":"key sk-ant-api03-' + b"a" * 40 + b'"}\n'
    for engine in ("auto", "python") if native.AVAILABLE else ("python",):
        code = (
            "import sys\n"
            "from composer_pipeline.cli import main\n"
            f"rc = main(['ingest', {str(root)!r}, '--out', {str(tmp_path / engine)!r}, '--engine', {engine!r}])\n"
            "from composer_pipeline import scrub\n"
            f"re2 = scrub._candidate_lines({line!r}, 're2')\n"
            "print('LOADED', rc, 'pyarrow' in sys.modules, sys.modules['pyarrow'].lib.np, re2, file=sys.stderr)\n"
        )
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        assert f"LOADED 0 True None [(10, {len(line) - 1})]" in p.stderr, p.stderr
        totals = [ln for ln in p.stdout.splitlines() if '"total"' in ln][-1]
        if engine == "auto":
            assert '"python_fallback_sessions": 1' in totals, totals
        assert cli.main(["ingest", str(root), "--out", str(tmp_path / f"{engine}_in_process"), "--engine", engine]) == 0
        for name in ("trace_states", "trace_messages", "quarantine"):
            got = pq.read_table(tmp_path / engine / f"{name}.parquet")
            assert got.num_rows
            assert got.equals(pq.read_table(tmp_path / f"{engine}_in_process" / f"{name}.parquet")), name


@pytest.mark.skipif(not native.AVAILABLE, reason=f"native engine not built: {native.IMPORT_ERROR}")
def test_sessions_the_compiled_engine_reads_whole_load_neither_the_python_readers_nor_msgspec(tmp_path):
    """The Python engine (parser.py, states.py) and the Codex reader are imported at first use
    (``pipeline._readers``): ~0.007 CPU-s of every ingest process. A damaged line still gets its quarantine
    row (the Python reader, loaded then, classifies it for the compiled engine)."""
    for name, damaged in (("clean", False), ("damaged", True)):
        s = Session()
        s.user("hi")
        s.assistant(text("hello"))
        if damaged:
            s.raw('{"type":"user","uuid":')
        s.write(tmp_path / name / "p" / "s.jsonl")
    code = (
        "import sys\n"
        "import pyarrow.parquet as pq\n"
        "from composer_pipeline.cli import main\n"
        "rc = main(['ingest', sys.argv[1], '--out', sys.argv[2]])\n"
        "readers = ('msgspec', 'composer_pipeline.ingest.parser', 'composer_pipeline.ingest.states', "
        "'composer_pipeline.ingest.codex')\n"
        "loaded = [m for m in readers if m in sys.modules]\n"
        "rows = [pq.read_metadata(f'{sys.argv[2]}/{t}.parquet').num_rows for t in ('trace_states', 'quarantine')]\n"
        "print('LOADED', rc, loaded, rows, file=sys.stderr)\n"
    )
    for name, expected in (
        ("clean", "LOADED 0 [] [1, 0]"),
        (
            "damaged",
            "LOADED 0 ['msgspec', 'composer_pipeline.ingest.parser', 'composer_pipeline.ingest.states', "
            "'composer_pipeline.ingest.codex'] [1, 1]",
        ),
    ):
        p = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / name), str(tmp_path / f"{name}_out")],
            capture_output=True,
            text=True,
        )
        assert p.returncode == 0, p.stderr
        assert expected in p.stderr, p.stderr


def test_a_run_builds_the_parser_of_its_own_subcommand_only(tmp_path, monkeypatch, capsys, repo_root):
    """``main`` registers only the subcommand it is given (argparse looks up a translation for every
    string of every other one: ~0.003 CPU-s of each run); its help reads as in the parser of every
    subcommand, and without a known subcommand all are registered (help, usage errors)."""
    names = [cli.command_name(m) for m in cli.SUBCOMMANDS]

    def choices(parser) -> list[str]:
        return list(parser._subparsers._group_actions[0].choices)

    assert choices(cli.build_parser()) == choices(cli.build_parser("no-such-command")) == names
    for name in names:
        assert choices(cli.build_parser(name)) == [name]
        helps = []
        for parser in (cli.build_parser(name), cli.build_parser()):
            with pytest.raises(SystemExit):
                parser.parse_args([name, "--help"])
            helps.append(capsys.readouterr().out)
        assert helps[0] == helps[1] and f"usage: composer-pipeline {name}" in helps[0], name

    registered = []
    for mod in cli.SUBCOMMANDS:
        monkeypatch.setattr(mod, "register", lambda sub, mod=mod, f=mod.register: (registered.append(mod), f(sub))[1])
    samples = repo_root / "composer_pipeline" / "samples" / "projects"
    assert cli.main(["ingest", str(samples), "--out", str(tmp_path / "out")]) == 0
    assert registered == [cli.ingest]
