"""Helpers for the fault and load tests: worker subprocesses, a TCP proxy, polling.

The proxy runs as its own process (``python -m tests.support.faults proxy
LISTEN_PORT TARGET_PORT``): killing it closes every connection through it at
once, as a database host going away would, without touching the real server
that other test runs share.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from django.db import connection

from tests.support import REPO, subprocess_env

T = TypeVar("T")

#: Generous: the machine is shared and slow at times. Tests poll, never sleep.
DEADLINE = 120.0


def wait_for(
    condition: Callable[[], T], what: str, timeout: float = DEADLINE, every: float = 0.05
) -> T:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url(port: int | None = None) -> str:
    """A DATABASE_URL for the test database, optionally through another port."""
    settings = connection.settings_dict
    host = settings.get("HOST") or "127.0.0.1"
    user = settings.get("USER") or "postgres"
    return f"postgres://{user}@{host}:{port or settings.get('PORT') or 5432}/{settings['NAME']}"


class Worker:
    """``manage.py resume_due_runs`` as a real process, its stderr in a file."""

    def __init__(self, log_dir: Path, *args: str, name: str = "worker", **env: str) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.out_path = log_dir / f"{name}.out"
        self._log = self.log_path.open("w")
        self._out = self.out_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, str(REPO / "manage.py"), "resume_due_runs", *args],
            cwd=REPO,
            env=subprocess_env(PGAPPNAME=name, **env),
            stdout=self._out,
            stderr=self._log,
            text=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text()

    def out(self) -> str:
        return self.out_path.read_text()

    def alive(self) -> bool:
        return self.process.poll() is None

    def rss_kib(self) -> int | None:
        """Resident memory (VmRSS) in KiB, or None once the process is gone."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            return None
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return None

    def signal(self, signum: int) -> None:
        if self.alive():
            os.kill(self.pid, signum)

    def wait(self, timeout: float = DEADLINE) -> int:
        try:
            return self.process.wait(timeout=timeout)
        finally:
            self._close_files()

    def stop(self) -> int:
        """SIGTERM and wait; SIGKILL if it does not go (so no test leaks a process)."""
        self.signal(signal.SIGTERM)
        try:
            return self.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.wait()

    def _close_files(self) -> None:
        for handle in (self._log, self._out):
            if not handle.closed:
                handle.close()

    def __repr__(self) -> str:
        return f"<Worker {self.name} pid={self.pid}>\n--- log ---\n{self.log()}"


class Proxy:
    """A TCP forwarder to the real PostgreSQL that a test can take down and bring back."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self.target_port = target_port
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        assert self.process is None, "the proxy is already up"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.faults", "proxy", str(self.port)]
            + [str(self.target_port)],
            cwd=REPO,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.strip() == "ready", f"the proxy did not start: {line!r}"

    def stop(self) -> None:
        """Kill the proxy: every connection through it breaks at once."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=60)
            assert self.process.stdout is not None
            self.process.stdout.close()
            self.process = None


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _serve_proxy(listen_port: int, target_port: int) -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", listen_port))
    server.listen(64)
    print("ready", flush=True)
    while True:
        client, _ = server.accept()
        try:
            upstream = socket.create_connection(("127.0.0.1", target_port))
        except OSError:
            client.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def main(argv: list[str]) -> Any:
    if argv[:1] == ["proxy"]:
        return _serve_proxy(int(argv[1]), int(argv[2]))
    raise SystemExit(f"usage: python -m tests.support.faults proxy LISTEN_PORT TARGET_PORT: {argv}")


if __name__ == "__main__":
    main(sys.argv[1:])
