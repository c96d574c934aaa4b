"""A throwaway PostgreSQL server on 127.0.0.1 for tests and benchmarks (Debian's ``postgresql`` package).

The server refuses to run as root, so as root the data directory is handed to the package's
``postgres`` user and ``initdb``/``pg_ctl`` run through ``runuser``; as any other user they run
directly. Trust authentication, loopback only, a Unix socket inside the data directory; stopped with
``pg_ctl -m immediate`` and the directory removed. Start ≈ 1–2 s.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def pg_bin_dir() -> Path | None:
    """Where Debian puts the server binaries (``/usr/lib/postgresql/<major>/bin``), newest major first."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]), reverse=True)
    return Path(found[0]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """``with PostgresServer() as pg: pg.url`` -> ``postgresql://postgres@127.0.0.1:PORT/postgres``."""

    def __init__(self) -> None:
        self.bin = pg_bin_dir()
        if self.bin is None:
            raise RuntimeError(
                "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin: install the "
                "Debian `postgresql` package (python3 -m composer_pipeline.bootstrap test does)"
            )
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="composer-pg-"))
        self.data = self.dir / "data"
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_owner(self, cmd: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd

    def start(self) -> PostgresServer:
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        subprocess.run(
            self._as_owner(
                [
                    str(self.bin / "initdb"),
                    "-D",
                    str(self.data),
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "--no-sync",
                    "-E",
                    "UTF8",
                ]
            ),
            check=True,
            capture_output=True,
        )
        self._pg_ctl("start")
        return self

    def _pg_ctl(self, action: str, *extra: str) -> None:
        opts = (
            f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=200 -c shared_buffers=32MB"
        )
        r = subprocess.run(
            self._as_owner(
                [
                    str(self.bin / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.dir / "log"),
                    "-w",
                    "-o",
                    opts,
                    *extra,
                    action,
                ]
            ),
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            log = (self.dir / "log").read_text() if (self.dir / "log").exists() else ""
            raise RuntimeError(f"PostgreSQL did not {action}: {r.stdout}{r.stderr}{log}")

    def restart(self) -> None:
        """``pg_ctl restart -m fast`` (what a managed service does for maintenance): every connection is dropped."""
        self._pg_ctl("restart", "-m", "fast")

    def halt(self) -> None:
        """Stop the server (fast: sessions terminated), keeping its data; :meth:`resume` starts it again."""
        self._pg_ctl("stop", "-m", "fast")

    def resume(self) -> None:
        self._pg_ctl("start")

    def stop(self) -> None:
        subprocess.run(
            self._as_owner([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"]),
            capture_output=True,
        )
        shutil.rmtree(self.dir, ignore_errors=True)

    def create_database(self, name: str) -> str:
        """A fresh database on this server; returns its URL."""
        import psycopg2

        conn = psycopg2.connect(self.url)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        conn.close()
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
