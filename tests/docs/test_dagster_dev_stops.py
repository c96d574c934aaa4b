"""The README's UI launch line stops promptly on SIGTERM when it runs in the background (issue 23).

A non-interactive shell starts a ``&`` job with SIGINT ignored, and ``dagster dev`` maps SIGTERM to its
SIGINT handler: started that way it ignored SIGTERM and left only after its subprocess timeouts (93 s
measured). The README's line resets SIGINT first (``env --default-signal=INT``). Here: that line, as
printed (its UI port made free, on a temporary DAGSTER_HOME), started with ``bash -c '... &'``, then
SIGTERM once it serves.
"""

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from test_readme_commands import readme_commands

REPO = Path(__file__).resolve().parents[2]


# a real dagster dev: ~15-40 s to start here
@pytest.mark.slow
def test_readme_launch_line_stops_on_sigterm_in_the_background(tmp_path):
    (line,) = [
        c
        for c in readme_commands((REPO / "README.md").read_text())
        if c.startswith("DAGSTER_HOME=") and "dagster dev" in c
    ]
    assert "env --default-signal=INT .venv/bin/dagster dev" in line
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = re.sub(r"^(\S+=\S+\s+)+", "", line).replace(
        "-p 3000",
        f"-p {port}",
        # the repo's own variables: a tmp instance
    )
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path / "dh"),
        "COMPOSER_PIPELINE_RECIPE": str(tmp_path / "none.yaml"),
        "COMPOSER_PIPELINE_HOME": str(tmp_path / "home"),
        "COMPOSER_STORE": str(tmp_path / "store"),
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
    }
    (tmp_path / "dh").mkdir()
    shell = subprocess.Popen(
        ["bash", "-c", f"{cmd} > {tmp_path / 'dev.log'} 2>&1 & echo $!; wait"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pid = int(shell.stdout.readline())
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        else:
            pytest.fail("dagster dev did not serve: " + (tmp_path / "dev.log").read_text()[-2000:])
        t0 = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        # bash waits for its job: it returns when dagster dev has exited
        shell.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
    assert took < 20, f"dagster dev took {took:.0f}s to stop after SIGTERM"
    assert "Dagster services shut down." in (tmp_path / "dev.log").read_text()
