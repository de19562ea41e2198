"""Scraping Prometheus metrics over HTTP from a worker child process, shared by test_metrics.py
and test_metrics_series.py."""

from __future__ import annotations

import socket
import subprocess
import urllib.request

from cli_worker_support import WAIT_S
from prometheus_client import parser


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample at http://127.0.0.1:PORT/metrics: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT_S) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in parser.text_string_to_metric_families(text)
        for s in family.samples
    }


def try_scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    try:
        return scrape(port)
    except OSError:  # not listening yet
        return {}


def stop(child: subprocess.Popen[str]) -> tuple[str, str]:
    child.terminate()
    try:
        return child.communicate(timeout=WAIT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
