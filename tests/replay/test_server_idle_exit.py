"""The local teacher server's idle exit waits for the completions in flight (issue 23).

Before: idle counted from the *start* of the last request, so with requests queued on a model's lock
the server shut down under a running generation: clients got a dropped connection and the process
died with a C++ abort (``terminate called without an active exception``, exit 134). A real server
process on loopback, the offline tiny model, concurrent requests that take longer than ``idle_exit_s``.
"""

import concurrent.futures as cf
import math
import socket
import subprocess
import sys
import time

import httpx
import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# a server process + generations outlasting the idle limit: ~45 s here
@pytest.mark.slow
def test_idle_exit_waits_for_requests_in_flight(tmp_path, tiny_model_dir):
    port = _free_port()
    log = tmp_path / "serve.log"
    proc = subprocess.Popen(
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
            "--idle-exit-s",
            "1",
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)

        # sampled (no greedy memo): every request generates, one at a time (the model's lock)
        def ask(i: int) -> int:
            body = {
                "model": "tiny",
                "messages": [{"role": "user", "content": f"fix bug {i} in app.py"}],
                "max_tokens": 192,
                "temperature": 1.0,
                "seed": i,
            }
            return httpx.post(f"{url}/chat/completions", json=body, timeout=120).status_code

        # enough queued generations to outlast idle_exit_s on any machine: one timed first (an idle CPU
        # generates the tiny model's 192 tokens in ~0.15 s, so a fixed 4 requests proved nothing there)
        t0 = time.monotonic()
        first = ask(-1)
        one = time.monotonic() - t0
        n = min(64, max(4, math.ceil(3.0 / max(one, 0.01))))
        t0 = time.monotonic()
        with cf.ThreadPoolExecutor(4) as pool:
            codes = [first, *pool.map(ask, range(n))]
        took = time.monotonic() - t0
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text(errors="replace")
    assert took > 1.5, f"the requests took {took:.1f}s: too fast to outlast idle_exit_s (the test proves nothing)"
    assert codes == [200] * len(codes), codes
    assert rc == 0 and "terminate called" not in text, text[-2000:]
    # it did leave by itself, after the last answer
    assert "idle_exit_s 1" in text
