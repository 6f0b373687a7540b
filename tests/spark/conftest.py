"""One Spark cluster for every Spark test of the session: ``local-cluster[2,1,1024]``,
a master, a worker and two executor JVMs of one core each (as separate processes as on
a real cluster); stopped afterwards, with no JVM of it left."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

pytest.importorskip("pyspark", reason="the Spark tests need pyspark: pip install "
                                      "horovodish[spark]")


def _java_processes() -> set[int]:
    out = subprocess.run(["pgrep", "-f", "org.apache.spark"], capture_output=True,
                         text=True).stdout
    return {int(pid) for pid in out.split()}


def _stop_gateway() -> None:
    """The driver's own JVM (py4j's gateway), which outlives ``stop()`` until this
    process ends otherwise."""
    from pyspark import SparkContext
    gateway = SparkContext._gateway
    if gateway is None:
        return
    gateway.shutdown()
    process = getattr(gateway, "proc", None)
    if process is not None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
    SparkContext._gateway = SparkContext._jvm = None


@pytest.fixture(scope="session")
def spark():
    if shutil.which("java") is None:
        pytest.fail("the Spark tests need a Java runtime: apt-get install -y "
                    "openjdk-17-jre-headless (.ci/run does)", pytrace=False)
    from pyspark.sql import SparkSession
    os.environ["PYSPARK_PYTHON"] = sys.executable
    before = _java_processes()
    session = (SparkSession.builder.master("local-cluster[2,1,1024]")
               .config("spark.executor.memory", "512m").config("spark.ui.enabled", "false")
               .config("spark.task.maxFailures", "1")
               .config("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures", "1")
               .config("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s")
               .getOrCreate())
    try:
        yield session
    finally:
        session.stop()
        _stop_gateway()
        deadline = time.monotonic() + 30
        while _java_processes() - before and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _java_processes() - before
        for pid in left:
            os.kill(pid, 9)
        assert not left, f"Spark JVMs left running: {left}"
