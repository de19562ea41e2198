"""One name for this process as a worker: ``<host>:<pid>:<random>``.

Log lines, Prometheus metrics, lease holders and the worker registry all name the worker the
same way, so an operator can follow one process from a log line to the tasks it holds. The host
and pid say where to look; the random part tells apart two processes that reuse a pid (a
restarted container often gets pid 1 again). The id is made once per process: a forked child
(its pid differs) makes its own.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading

__all__ = ["worker_id"]

_lock = threading.Lock()
_made: tuple[int, str] | None = None  # (pid it was made in, the id)


def worker_id() -> str:
    """This process's worker id, ``<host>:<pid>:<8 hex digits>``, the same on every call."""
    global _made
    pid = os.getpid()
    made = _made
    if made is not None and made[0] == pid:
        return made[1]
    with _lock:
        if _made is None or _made[0] != pid:
            host = socket.gethostname() or "localhost"
            _made = (pid, f"{host}:{pid}:{secrets.token_hex(4)}")
        return _made[1]
