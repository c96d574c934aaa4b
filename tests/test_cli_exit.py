"""The ``composer-pipeline`` executable ends through ``cli.run``: the command's exit code, Python's exit
steps (atexit handlers, flushed output), and no C++ static destruction afterwards (an Arrow scan thread alive
in teardown aborted ``show``/``lineage`` with -6 after they had finished; see ``cli.run``). The race itself
cannot be forced here: these tests check that the exit path keeps what a normal exit does."""

import subprocess
import sys
import textwrap


def _run(tmp_path, argv: list[str]) -> tuple[subprocess.CompletedProcess, str]:
    marker = tmp_path / "atexit.txt"
    code = textwrap.dedent(
        f"""
        import atexit
        atexit.register(lambda: open({str(marker)!r}, "w").write("ran"))
        from composer_pipeline.cli import run
        run({argv!r})
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return proc, marker.read_text() if marker.exists() else ""


def test_a_command_exits_with_its_code_after_the_atexit_handlers_and_its_output(tmp_path):
    proc, marker = _run(tmp_path, ["show", "--store", str(tmp_path / "nothing-here"), "--all", "--json"])
    assert proc.returncode != 0 and "nothing-here" in proc.stderr  # a clear error, its code kept
    assert marker == "ran"


def test_help_and_usage_errors_keep_argparses_codes(tmp_path):
    proc, marker = _run(tmp_path, ["--help"])
    assert proc.returncode == 0 and "usage: composer-pipeline" in proc.stdout and marker == "ran"
    proc, marker = _run(tmp_path, ["no-such-command"])
    assert proc.returncode == 2 and "invalid choice" in proc.stderr and marker == "ran"
