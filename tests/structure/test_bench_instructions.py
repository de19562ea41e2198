"""scripts/bench/instructions.py (docs/benchmarks.md, Instructions per task): reading a callgrind
dump's total, and one small run under valgrind.

The script imports dueq and its sibling bench modules only inside ``main``, so loading it by
path here needs the standard library alone.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from paths_support import SCRIPTS, SRC

SCRIPT = SCRIPTS / "bench" / "instructions.py"

#: The shape of a numbered dump ``callgrind_control --dump`` makes (valgrind 3.19): its
#: ``summary:`` reads 0, its ``totals:`` (the last line) holds the count.
DUMP = """\
# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 2010
cmd:  /usr/bin/redis-server --port 17916 --save  --appendonly no
part: 1

desc: Trigger: dump

positions: line
events: Ir
summary: 0


ob=(1) /usr/bin/redis-server
fl=(1) ???
fn=(888)
0 2300

totals: 2836446
"""


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_instructions", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_dump_total_is_read_from_its_totals_line_not_its_zero_summary():
    assert load_script().dump_total(DUMP) == 2836446


def test_a_dump_without_totals_gives_its_summary():
    text = "events: Ir\nsummary: 1234\n"
    assert load_script().dump_total(text) == 1234


def test_a_dump_of_several_events_gives_the_one_asked_for():
    text = "events: Ir Dr Dw\nsummary: 1 2 3\ntotals: 10 20 30\n"
    script = load_script()
    assert script.dump_total(text) == 10
    assert script.dump_total(text, "Dw") == 30


def test_a_text_with_no_total_or_without_the_event_is_refused():
    script = load_script()
    with pytest.raises(ValueError, match="no totals"):
        script.dump_total("events: Ir\npositions: line\n")
    with pytest.raises(ValueError, match="not Bc"):
        script.dump_total(DUMP, "Bc")


def test_the_numbered_dumps_are_found_by_their_number(tmp_path: Path):
    out = tmp_path / "callgrind.out"
    for name in ("callgrind.out", "callgrind.out.1", "callgrind.out.12", "callgrind.out.x"):
        (tmp_path / name).write_text("")
    found = load_script().dump_files(out)
    assert found == {1: tmp_path / "callgrind.out.1", 12: tmp_path / "callgrind.out.12"}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_small_run_counts_more_server_instructions_per_task_for_dueq_than_raw_and_keeps_dumps(
    tmp_path: Path,
):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    run = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--tasks",
            "50",
            "--cases",
            "raw,engine",
            "--timeout-s",
            "500",
            "--keep-dumps",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=560,
        env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    assert figures["dueq"].startswith(str(SRC)), figures
    cases = figures["cases"]
    assert [cases[c]["tasks"] for c in ("raw", "engine")] == [50, 50]
    assert 0 < cases["raw"]["ir_per_task"] < cases["engine"]["ir_per_task"], cases
    script = load_script()
    kept = {case: script.dump_total((tmp_path / f"{case}.callgrind").read_text()) for case in cases}
    assert kept == {case: cases[case]["ir"] for case in cases}
