"""TeachersResource starts `composer-pipeline teachers serve` when a loopback teacher does not answer."""

import os
import socket
import time

import httpx
import pytest
import yaml

from resources.teachers import TeachersResource

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_local_teacher_server_autostarts_and_answers(tmp_path, tiny_model_dir):
    port = _free_port()
    url = f"http://127.0.0.1:{port}/v1"
    recipe = tmp_path / "teachers.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "ceiling_usd": 1.0,
                "serve": {"tiny": str(tiny_model_dir)},
                "teachers": [
                    {
                        "name": "tiny",
                        "base_url": url,
                        "model": "tiny",
                        "api_key_env": None,
                        "input_usd_per_mtok": 0.1,
                        "output_usd_per_mtok": 0.1,
                        "budget_usd": 1.0,
                        "max_concurrency": 1,
                        "max_tokens": 8,
                    }
                ],
            }
        )
    )
    res = TeachersResource(recipe=str(recipe), cache_dir=str(tmp_path / "state" / "cache"), startup_timeout_s=240)
    started = res.ensure_local_servers()
    pid_file = tmp_path / "state" / f"teacher_server-{port}.pid"
    try:
        assert started == [url]
        assert pid_file.is_file()
        r = httpx.post(
            f"{url}/chat/completions",
            timeout=60,
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        # already answering: nothing started twice
        assert res.ensure_local_servers() == []
        assert (tmp_path / "state" / f"teacher_server-{port}.log").is_file()
    finally:
        if pid_file.is_file():
            pid = int(pid_file.read_text())
            os.kill(pid, 15)
            for _ in range(50):
                try:
                    os.kill(pid, 0)
                    os.waitpid(pid, os.WNOHANG)
                except (ProcessLookupError, ChildProcessError):
                    break
                time.sleep(0.1)


def test_a_started_server_is_stoppable_and_stops_itself_when_idle(tmp_path, tiny_model_dir):
    """No undocumented leftover: `composer-pipeline teachers stop` ends it now, and idle it ends itself."""
    from composer_pipeline.cli import main
    from composer_pipeline.teachers.server import process_alive as _running

    port = _free_port()
    url = f"http://127.0.0.1:{port}/v1"
    recipe = tmp_path / "teachers.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "ceiling_usd": 1.0,
                "serve": {"tiny": str(tiny_model_dir)},
                "teachers": [
                    {
                        "name": "tiny",
                        "base_url": url,
                        "model": "tiny",
                        "api_key_env": None,
                        "input_usd_per_mtok": 0.1,
                        "output_usd_per_mtok": 0.1,
                        "budget_usd": 1.0,
                        "max_concurrency": 1,
                        "max_tokens": 8,
                    }
                ],
            }
        )
    )
    state = tmp_path / "state"
    pid_file = state / f"teacher_server-{port}.pid"
    res = TeachersResource(recipe=str(recipe), cache_dir=str(state / "cache"), startup_timeout_s=240)
    assert res.ensure_local_servers() == [url]
    pid = int(pid_file.read_text())
    assert _running(pid)
    assert main(["teachers", "stop", "--state-dir", str(state)]) == 0
    assert not _running(pid) and not pid_file.exists()

    idle = TeachersResource(
        recipe=str(recipe), cache_dir=str(state / "cache"), startup_timeout_s=240, local_server_idle_s=2
    )
    assert idle.ensure_local_servers() == [url]
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 30
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    # it left by itself and took its pid file along
    assert not _running(pid) and not pid_file.exists()
    assert "idle_exit_s 2" in (state / f"teacher_server-{port}.log").read_text()


def test_a_server_exits_with_the_process_it_belongs_to(tmp_path, tiny_model_dir):
    """`--exit-with-pid`: under dagster dev the resource names the code location's process, so stopping
    the UI stops the teacher server its runs started."""
    import subprocess
    import sys

    from composer_pipeline.teachers.server import process_alive as _running

    owner = subprocess.Popen(["sleep", "600"])
    port = _free_port()
    log = tmp_path / "serve.log"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "composer_pipeline",
            "teachers",
            "serve",
            "--model",
            f"tiny={tiny_model_dir}",
            "--port",
            str(port),
            "--exit-with-pid",
            str(owner.pid),
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        assert _running(server.pid)
        owner.kill()
        owner.wait()
        assert server.wait(timeout=30) == 0
        assert f"process {owner.pid} (exit_with_pid) is gone" in log.read_text()
    finally:
        for p in (owner, server):
            if p.poll() is None:
                p.kill()
