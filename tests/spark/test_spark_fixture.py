"""The ``spark`` fixture's start (``slow_start_support``): outside each test's timeout, and a start
that fails fails one test with its reason, not every Spark test with the same traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence

import pytest
import slow_start_support
from paths_support import ROOT

pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'dueq[spark]'")

#: Three tests of the fixture (and one without it, which runs).
SPARK_TESTS = (
    "tests/spark/test_spark.py::test_rows_are_scheduled_once_with_due_time_and_payload",
    "tests/spark/test_spark.py::test_row_hash_ids_are_stable_across_runs",
    "tests/spark/test_spark.py::test_read_tasks_refuses_an_unknown_state",
    "tests/spark/test_spark.py::test_partition_function_raises_on_a_bad_row_when_asked",
)


def run_pytest(tests: Sequence[str], **env: str) -> tuple[int, str]:
    """``pytest tests`` in a subprocess (one process, the short summary of failures, errors
    and skips on wide lines) with ``env`` added: its exit code and output."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:randomly", "-rfEs", *tests],
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "1000", **env},
        capture_output=True,
        text=True,
        timeout=800,
    )
    return run.returncode, run.stdout


@pytest.mark.timeout(600)
def test_a_spark_start_that_fails_fails_the_first_test_with_its_reason_and_skips_the_rest(
    tmp_path,
):
    returncode, out = run_pytest(SPARK_TESTS, JAVA_HOME=str(tmp_path / "no-java-here"))
    assert returncode == 1, out
    assert "1 passed, 2 skipped, 1 error" in out, out
    [failed] = [line for line in out.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    assert failed.startswith(f"ERROR {SPARK_TESTS[0]} - Failed: the SparkSession did not start")
    assert "JAVA_GATEWAY_EXITED" in failed and "no-java-here" in failed, failed
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED ")]
    assert len(skipped) == 2, out
    for line in skipped:
        assert line.endswith(f"the SparkSession did not start: the reason is in {SPARK_TESTS[0]}")
    # one report in the errors section, without a traceback (not one per Spark test)
    assert "Traceback" not in out and out.count("JAVA_GATEWAY_EXITED") == 2, out


def test_a_start_past_its_bound_is_remembered_and_reported_once():
    start = slow_start_support.SlowStart("the slow thing", lambda: time.sleep(30) or "late", 0.2)
    began = time.monotonic()
    start.begin()
    assert time.monotonic() - began < 10  # the bound, not the start, ended the wait
    with pytest.raises(pytest.fail.Exception, match=r"not started within its bound of 0.2 s"):
        start.get("tests/a.py::first")
    with pytest.raises(pytest.skip.Exception, match=r"the reason is in tests/a.py::first$"):
        start.get("tests/a.py::second")
    assert start.value is None


#: The two tests below exist only in the subprocess of the test after them.
CUT_OFF_DEMO = os.environ.get("DUEQ_TEST_SPARK_CUT_OFF") == "1"

if CUT_OFF_DEMO:

    @pytest.mark.timeout(8)
    def test_cut_off_1_a_spark_job_that_outlasts_the_timeout(spark):
        def slow(v: int) -> int:
            time.sleep(45)
            return v

        spark.range(2, numPartitions=1).select(
            spark_functions().udf(slow, "long", useArrow=False)("id")
        ).collect()

    def test_cut_off_2_the_next_spark_test(spark):
        assert spark.range(7).count() == 7


def spark_functions():
    from pyspark.sql import functions

    return functions


@pytest.mark.timeout(900)  # a JVM of its own starts in the subprocess
def test_a_spark_test_cut_off_by_its_timeout_fails_alone_and_the_later_ones_skip():
    """A test cut off by pytest-timeout inside a py4j call leaves the call's answer on its
    connection for the next call to read as its own: every later Spark test failed, each
    with its own traceback. Now they skip, naming the test that was cut off."""
    tests = [
        f"tests/spark/test_spark_fixture.py::test_cut_off_{n}"
        for n in ("1_a_spark_job_that_outlasts_the_timeout", "2_the_next_spark_test")
    ]
    _, out = run_pytest(tests, DUEQ_TEST_SPARK_CUT_OFF="1")
    assert "1 failed, 1 skipped" in out, out
    [failed] = [line for line in out.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    assert failed.startswith(f"FAILED {tests[0]} - Failed: Timeout"), failed
    [skipped] = [line for line in out.splitlines() if line.startswith("SKIPPED ")]
    assert skipped.endswith(
        f"the SparkSession is unusable: a py4j call was cut off by the timeout of {tests[0]}"
    ), skipped


def test_a_stream_runs_again_only_when_its_python_worker_did_not_connect_back_in_time():
    from spark_support import WORKER_TIMEOUT, WORKER_TRIES, run_to_end

    runs: list[int] = []

    def late_once() -> str:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError(f"[STREAM_FAILED] terminated with exception: {WORKER_TIMEOUT}.")
        return "done"

    assert run_to_end(late_once) == "done"
    assert len(runs) == 2

    def refused() -> None:
        runs.append(1)
        raise ValueError("events are off for queue 'q'")

    runs.clear()
    with pytest.raises(ValueError, match="events are off"):
        run_to_end(refused)
    assert len(runs) == 1  # the test's own error: not run again

    def always_late() -> None:
        runs.append(1)
        raise RuntimeError(WORKER_TIMEOUT)

    runs.clear()
    with pytest.raises(RuntimeError, match=WORKER_TIMEOUT):
        run_to_end(always_late)
    assert len(runs) == WORKER_TRIES
