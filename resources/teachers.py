"""Teachers as a Dagster resource: the teachers recipe, API keys via ``dg.EnvVar``, the response cache,
and an on-demand local teacher server for loopback ``base_url`` s.

In: ``recipe`` (path of a teachers YAML), ``api_keys`` (teacher name -> ``dg.EnvVar("NAME")``; the UI
and run config only ever show the variable name), ``cache_dir``. Out: ``TeachersConfig``, the keys
as a dict for ``ReplayRun.replay`` (never logged), a ``ResponseCache``.

``ensure_local_servers()`` makes the embedded default work when a user clicks Materialize in the UI:
for each teacher whose base_url is loopback and where nothing answers, it starts
``composer-pipeline teachers serve`` for the recipe's ``serve`` models as a detached process
(logging to ``<cache_dir>/../teacher_server-<port>.log``) and waits until ``/v1/models`` answers.
The server outlives the run that started it, so the next run does not load the models again, but
not the code location: it exits with the process that launched the run's worker (under ``dagster
dev``: the code location server, so stopping ``dagster dev`` stops it; ``stop_with_parent``), after
``local_server_idle_s`` (default 600) without a completion request, or on ``composer-pipeline teachers
stop`` (pid file beside the log). The run's log says which process it is and how it ends.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import dagster as dg
import httpx

from composer_pipeline.home import default_cache_dir
from composer_pipeline.teachers.cache import ResponseCache
from composer_pipeline.teachers.config import load_teachers

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _answers(url: str, timeout: float = 2.0) -> bool:
    try:
        return httpx.get(url.rstrip("/") + "/models", timeout=timeout).status_code < 500
    except httpx.HTTPError:
        return False


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


class TeachersResource(dg.ConfigurableResource):
    """Teachers recipe + API keys (``dg.EnvVar``) + response cache location."""

    recipe: str
    api_keys: dict[str, str] = {}
    # None: composer_pipeline.home.default_cache_dir() (the CLI's)
    cache_dir: str | None = None
    autostart_local: bool = True
    startup_timeout_s: float = 180.0
    # a server a run started exits after this long without requests
    local_server_idle_s: int = 600
    stop_with_parent: bool = (
        # ... and when the process that launched this one exits (dagster dev: the code location)
        True
    )

    @property
    def cache_path(self) -> str:
        return default_cache_dir(self.cache_dir)

    @property
    def prepared_dir(self) -> str:
        """Where ``cost_plan`` leaves a run's prepared requests for ``teacher_replays`` (beside the cache)."""
        return str(Path(self.cache_path).expanduser().parent / "prepared_requests")

    def load_config(self):
        return load_teachers(self.recipe)

    def api_key_values(self) -> dict[str, str]:
        """teacher name -> API key value (for the HTTP client only; never log or store this)."""
        return {k: v for k, v in self.api_keys.items() if v}

    def response_cache(self):
        Path(self.cache_path).mkdir(parents=True, exist_ok=True)
        return ResponseCache(self.cache_path)

    def ensure_local_servers(self, log=None, only: set[str] | None = None) -> list[str]:
        """Start the local teacher server for loopback base_urls nobody answers on; returns started URLs.

        ``only``: names of the teachers that will actually be called (None = all of them).
        """
        cfg = self.load_config()
        started: list[str] = []
        for base in sorted({t.base_url for t in cfg.teachers if only is None or t.name in only}):
            u = urlparse(base)
            if u.hostname not in LOOPBACK or _answers(base):
                continue
            if not self.autostart_local:
                raise ConnectionError(f"no teacher server answers at {base} and autostart_local is off")
            if not cfg.serve:
                raise ConnectionError(f"no teacher server answers at {base} and {self.recipe} has no 'serve' models")
            port = u.port or 80
            if _port_open(u.hostname, port):
                raise ConnectionError(
                    f"{u.hostname}:{port} is taken by something that is not an OpenAI-compatible server"
                )
            log_path = Path(self.cache_path).resolve().parent / f"teacher_server-{port}.log"
            log_path.parent.mkdir(parents=True, exist_ok=True)
            pid_path = log_path.with_suffix(".pid")
            cmd = [
                sys.executable,
                "-m",
                "composer_pipeline",
                "teachers",
                "serve",
                "--config",
                str(self.recipe),
                "--host",
                u.hostname,
                "--port",
                str(port),
                "--idle-exit-s",
                str(self.local_server_idle_s),
                "--pid-file",
                str(pid_path),
            ]
            owner = os.getppid() if self.stop_with_parent else None
            if owner and owner > 1:
                cmd += ["--exit-with-pid", str(owner)]
            with open(log_path, "ab") as out:
                proc = subprocess.Popen(
                    cmd,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    env={**os.environ, "OMP_NUM_THREADS": "1"},
                )
            pid_path.write_text(str(proc.pid))
            if log:
                log.info(
                    f"started local teacher server pid={proc.pid} at {base} (log: {log_path}); it stops with "
                    + (f"process {owner} (the code location) or " if owner and owner > 1 else "")
                    + f"after {self.local_server_idle_s}s without requests; `composer-pipeline teachers stop "
                    f"--state-dir {log_path.parent}` stops it now"
                )
            deadline = time.monotonic() + self.startup_timeout_s
            while not _answers(base):
                if proc.poll() is not None:
                    tail = log_path.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"local teacher server exited with {proc.returncode}; log {log_path}:\n{tail}")
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"local teacher server at {base} not healthy after {self.startup_timeout_s}s; log {log_path}"
                    )
                time.sleep(0.5)
            started.append(base)
        return started


def api_key_envvars(recipe: str | None) -> dict[str, str]:
    """teacher name -> ``dg.EnvVar`` for each teacher whose ``api_key_env`` is set in this environment.

    Only the presence of the variable is checked here; its value is resolved by Dagster at run time.
    """
    if not recipe or not Path(recipe).is_file():
        return {}

    return {
        t.name: dg.EnvVar(t.api_key_env)
        for t in load_teachers(recipe).teachers
        if t.api_key_env and t.api_key_env in os.environ
    }
