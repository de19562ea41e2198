"""mypy --strict on tests/fixtures/ports_conform.py: ``Queue``, ``AsyncQueue``, ``QueueCore`` and
``ClaimBatch`` fit the protocols the parts of a queue take in their place (``dueq._wire.ports``,
``dueq.delivery.SettlingQueue``, ``dueq._consume``'s ``Claims``, ...).

Slow (mypy reads dueq: seconds with the repository's cache, some 15 s without). The layers and the
cycle test keep the parts from naming the front ends; this keeps the front ends honest to them.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from paths_support import FIXTURES, ROOT, SRC


@pytest.mark.slow
def test_the_front_ends_fit_the_protocols_the_parts_take() -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC), "MYPYPATH": str(SRC)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            str(FIXTURES / "ports_conform.py"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
