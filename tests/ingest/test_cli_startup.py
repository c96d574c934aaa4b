"""What an `ingest` process loads besides ingest: every import is CPU of every run (issue 35 §4), so a
local `--out` loads neither fsspec nor the budget ledger (asyncio, decimal), nor ``pyarrow.compute``
(~0.03 CPU-s; only the secret prefilter's RE2 fallback, where Hyperscan is missing, needs it), and the
ledger's errors still reach their exit codes from the commands that do load it."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from composer_pipeline import cli


def test_ingest_to_a_local_directory_loads_neither_fsspec_nor_the_ledger_nor_arrow_compute(tmp_path, repo_root):
    samples = repo_root / "composer_pipeline" / "samples" / "projects"
    code = (
        "import sys\n"
        "from composer_pipeline.cli import main\n"
        f"rc = main(['ingest', {str(samples)!r}, '--out', {str(tmp_path / 'out')!r}])\n"
        "loaded = [m for m in ('fsspec', 'asyncio', 'composer_pipeline.ledger', 'pyarrow.compute') if m in sys.modules]\n"
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
