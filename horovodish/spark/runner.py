"""``horovodish.spark.run``: Horovod's ``horovod.spark.run`` on a Spark cluster.

    import horovodish.spark
    results = horovodish.spark.run(train, args=(epochs,), num_proc=4)  # rank order

One Spark barrier stage of ``num_proc`` tasks (all scheduled at once, or none), each
task one rank: it starts ``python -m horovodish.spark.task`` (a fresh interpreter, so
every job forms its own MPI world) with the rank's variables, and that process joins
the job's PMI server, which runs here in the driver. Each rank's value comes back in
rank order; a rank that raises fails the call with its error; each rank's output is
written to ``stdout``/``stderr`` here, each line prefixed ``[rank]<stdout>:`` /
``[rank]<stderr>:`` as Horovod does, once the stage ends.

``run_elastic`` reruns the stage from the last commit when a rank is lost (a task
killed, an executor gone): Spark schedules a barrier stage only whole, so each attempt
has ``num_proc`` ranks, on whichever executors Spark has then.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, Callable, TextIO

import cloudpickle

from ..common.elastic_store import ENV_DIR
from ..common.runtime.launcher_link import ENV_GENERATION
from ..common.world.driver_world import DriverWorld
from ..common.world.launch_env import SERVER_VARIABLE

START_TIMEOUT_VARIABLES = ("HOROVODISH_SPARK_START_TIMEOUT", "HOROVOD_SPARK_START_TIMEOUT")


@dataclass
class RankOutcome:
    rank: int
    exit_code: int
    value: Any = None
    error: str | None = None       # "Type: message" of what the function raised
    traceback: str | None = None
    stdout: str = ""
    stderr: str = ""


class SparkJobError(RuntimeError):
    """A rank of a horovodish Spark job failed; ``outcomes`` holds every rank's."""

    def __init__(self, message: str, outcomes: list[RankOutcome]) -> None:
        super().__init__(message)
        self.outcomes = outcomes


def run(fn: Callable[..., Any], args: tuple = (), kwargs: dict | None = None,
        num_proc: int | None = None, start_timeout: float | None = None,
        use_mpi: bool | None = None, use_gloo: bool | None = None,
        extra_mpi_args: str | None = None, env: dict[str, str] | None = None,
        stdout: TextIO | None = None, stderr: TextIO | None = None, verbose: int = 1,
        nics: Any = None, prefix_output_with_timestamp: bool = False,
        executable: str | None = None) -> list:
    """Run ``fn(*args, **kwargs)`` on ``num_proc`` ranks (default: Spark's default
    parallelism); its values in rank order. ``env``: more variables for the ranks.
    ``use_mpi``, ``use_gloo``, ``extra_mpi_args``, ``nics`` and
    ``prefix_output_with_timestamp`` are accepted for Horovod's scripts and change
    nothing (the transport is MPI, formed through the driver's PMI server)."""
    context = _spark_context()
    size = num_proc or context.defaultParallelism
    if verbose >= 1 and num_proc is None:
        print(f"Running {size} processes (inferred from spark.default.parallelism)...",
              file=stderr or sys.stderr)
    outcomes = _stage(context, fn, tuple(args), dict(kwargs or {}), size,
                      _start_timeout(start_timeout), env, executable)
    _report(outcomes, stdout, stderr)
    _raise_first_failure(outcomes)
    return [outcome.value for outcome in outcomes]


def run_elastic(fn: Callable[..., Any], args: tuple = (), kwargs: dict | None = None,
                num_proc: int | None = None, min_num_proc: int | None = None,
                max_num_proc: int | None = None, start_timeout: float | None = None,
                elastic_timeout: float | None = None, reset_limit: int | None = None,
                env: dict[str, str] | None = None, stdout: TextIO | None = None,
                stderr: TextIO | None = None, verbose: int = 1, nics: Any = None,
                prefix_output_with_timestamp: bool = False, min_np: int | None = None,
                max_np: int | None = None) -> list:
    """As ``run``, for a function that uses ``hvd.elastic.run`` and commits its state:
    when a rank is lost the stage runs again (at most ``reset_limit`` times more) and
    goes on from the last commit. Each attempt has ``num_proc`` ranks (see the module
    docstring); ``min_num_proc``/``max_num_proc`` are accepted for Horovod's scripts."""
    context = _spark_context()
    size = num_proc or max_num_proc or max_np or context.defaultParallelism
    commits = tempfile.mkdtemp(prefix="horovodish-spark-elastic-")
    os.rmdir(commits)  # each host's first rank makes it, mode 0700 (elastic_store)
    resets = 0
    while True:
        # (The attempt is the job's generation: launcher_link.generation() in the ranks.)
        outcomes = _stage(context, fn, tuple(args), dict(kwargs or {}), size,
                          _start_timeout(start_timeout),
                          {**(env or {}), ENV_DIR: commits, ENV_GENERATION: str(resets + 1)},
                          None)
        _report(outcomes, stdout, stderr)
        if all(outcome.exit_code == 0 for outcome in outcomes):
            _remove_everywhere(context, commits, size)
            return [outcome.value for outcome in outcomes]
        lost = [o for o in outcomes if o.exit_code != 0 and o.error is None]
        resets += 1
        if not lost or (reset_limit is not None and resets > reset_limit):
            _remove_everywhere(context, commits, size)
            _raise_first_failure(outcomes)
        if verbose >= 1:
            print(f"horovodish.spark.run_elastic: rank(s) "
                  f"{', '.join(str(o.rank) for o in lost)} lost; running the stage again "
                  f"from the last commit (reset {resets})", file=stderr or sys.stderr)


def _spark_context() -> Any:
    from pyspark import SparkContext
    context = SparkContext._active_spark_context
    if context is None:
        raise Exception("Could not find an active SparkContext, are you running in a "
                        "PySpark session?")
    return context


def _start_timeout(given: float | None) -> float:
    if given is not None:
        return float(given)
    for variable in START_TIMEOUT_VARIABLES:
        if os.environ.get(variable):
            return float(os.environ[variable])
    return 600.0


def _stage(context: Any, fn: Callable, args: tuple, kwargs: dict, size: int,
           start_timeout: float, env: dict[str, str] | None,
           executable: str | None) -> list[RankOutcome]:
    """One barrier stage of ``size`` ranks; every rank's outcome, in rank order."""
    world = DriverWorld(size, start_timeout, "Spark")
    driver_host = context.getConf().get("spark.driver.host", "127.0.0.1")
    payload = cloudpickle.dumps((fn, args, kwargs))
    ranks_env = [{**world.rank_env(rank), SERVER_VARIABLE: f"{driver_host}:{world.server.port}",
                  **(env or {})} for rank in range(size)]
    python = executable

    def task(_partition: Any) -> Any:
        from pyspark import BarrierTaskContext
        rank = BarrierTaskContext.get().partitionId()
        yield cloudpickle.dumps(_run_rank(rank, ranks_env[rank], payload, python))

    group = f"horovodish.spark.run.{world.run_id}"
    found: dict[str, Any] = {}

    def collect() -> None:
        context.setJobGroup(group, "horovodish.spark.run", interruptOnCancel=True)
        try:
            found["rows"] = context.parallelize(range(size), size).barrier() \
                .mapPartitions(task).collect()
        except BaseException as exc:  # noqa: BLE001 - raised below, in the caller
            found["error"] = exc

    thread = threading.Thread(target=collect, name="horovodish-spark-stage", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.5)
            if thread.is_alive() and world.server.process.poll() == 1 and "rows" not in found:
                # The server gave up on ranks that never came: tasks that did not start.
                thread.join(5.0)
                if thread.is_alive():
                    context.cancelJobGroup(group)
                    thread.join(30.0)
                    raise TimeoutError(
                        "Timed out waiting for Spark tasks to start. Please check that you "
                        "have enough resources to run all horovodish processes: each "
                        f"process is a Spark task of one barrier stage of {size}. Increase "
                        "start_timeout if your Spark resources are allocated on demand. "
                        f"Timeout after {start_timeout:g} seconds.")
    finally:
        world.stop()
    if "error" in found:
        spark_says = str(found["error"]).split("\n\tat ")[0].strip()
        if "BarrierJobSlotsNumberCheckFailed" in spark_says:
            raise RuntimeError(
                f"horovodish.spark.run: {size} ranks need {size} task slots at once (one "
                "barrier stage), and the cluster has fewer: give it more executor cores, "
                f"or pass a smaller num_proc. Spark: {spark_says}") from found["error"]
        raise RuntimeError(f"the Spark stage of horovodish.spark.run failed: "
                           f"{spark_says}") from found["error"]
    return sorted((cloudpickle.loads(row) for row in found["rows"]), key=lambda o: o.rank)


def _run_rank(rank: int, rank_env: dict[str, str], payload: bytes,
              executable: str | None) -> RankOutcome:
    """In the Spark task: the rank's process, its outcome and output."""
    with tempfile.TemporaryDirectory(prefix="horovodish-spark-") as folder:
        result_path = os.path.join(folder, "result")
        out_path, err_path = os.path.join(folder, "out"), os.path.join(folder, "err")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            code = subprocess.run(
                [executable or sys.executable, "-m", "horovodish.spark.task", result_path],
                input=payload, stdout=out, stderr=err,
                env={**os.environ, **rank_env, "PYTHONUNBUFFERED": "1"}).returncode
        outcome = RankOutcome(rank, code)
        with open(out_path, errors="replace") as out, open(err_path, errors="replace") as err:
            outcome.stdout, outcome.stderr = out.read(), err.read()
        if os.path.exists(result_path):
            with open(result_path, "rb") as source:
                result = cloudpickle.load(source)
            if result[0] == "ok":
                outcome.value = result[1]
            else:
                outcome.error, outcome.traceback = result[1], result[2]
        return outcome


def _report(outcomes: list[RankOutcome], stdout: TextIO | None, stderr: TextIO | None
            ) -> None:
    """Every rank's output, each line prefixed with its rank and stream."""
    for outcome in outcomes:
        for text, stream, name in ((outcome.stdout, stdout or sys.stdout, "stdout"),
                                   (outcome.stderr, stderr or sys.stderr, "stderr")):
            for line in text.splitlines():
                stream.write(f"[{outcome.rank}]<{name}>:{line}\n")
        (stdout or sys.stdout).flush()


def _raise_first_failure(outcomes: list[RankOutcome]) -> None:
    """The cause first: a rank whose function raised an error of its own (not a
    HorovodInternalError, which says that another rank failed), then any rank whose
    function raised, then the first that exited non-zero."""
    raised = [o for o in outcomes if o.error is not None]
    failed = [o for o in raised if not o.error.startswith("HorovodInternalError")] or \
        raised or [o for o in outcomes if o.exit_code != 0]
    if not failed:
        return
    first = failed[0]
    what = first.error if first.error else f"exited with code {first.exit_code}"
    detail = f"\n{first.traceback}" if first.traceback else \
        (f"\n{first.stderr.strip()[-2000:]}" if first.stderr.strip() else "")
    raise SparkJobError(f"horovodish.spark.run: rank {first.rank} failed: {what}{detail}",
                        outcomes)


def _remove_everywhere(context: Any, path: str, size: int) -> None:
    """An elastic job's commits, on the executors that ran its ranks, and here."""
    import shutil

    def remove(_partition: Any) -> Any:
        shutil.rmtree(path, ignore_errors=True)
        yield True
    try:
        context.parallelize(range(size), size).mapPartitions(remove).collect()
    except Exception:  # noqa: BLE001 - an executor gone keeps its copy (its /tmp)
        pass
    shutil.rmtree(path, ignore_errors=True)
