"""Horovod-style scripts (``import horovod.torch``, ``horovod.tensorflow``) run unchanged through the alias
package that ``python -m horovodish.compat`` puts on PYTHONPATH (docs/api.md)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from multirank import assert_ranks_ok, run_ranks

from horovodish.compat import alias_path

WORKERS = Path(__file__).parent / "workers"


def alias_env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (alias_path(), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path}


def test_the_module_prints_the_alias_directory():
    out = subprocess.run([sys.executable, "-m", "horovodish.compat"], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == alias_path() and (Path(out) / "horovod" / "__init__.py").is_file()


def test_a_horovod_module_that_horovodish_lacks_is_not_found():
    code = "import horovod.mxnet"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, **alias_env()})
    assert result.returncode != 0 and "horovod.mxnet" in result.stderr, result.stderr


def test_horovod_ray_and_spark_are_horovodish_s():
    code = ("import horovod.ray, horovod.spark, horovodish.ray, horovodish.spark\n"
            "from horovod.ray import RayExecutor, ElasticRayExecutor, BaseHorovodWorker\n"
            "assert RayExecutor is horovodish.ray.RayExecutor\n"
            "assert ElasticRayExecutor is horovodish.ray.ElasticRayExecutor\n"
            "assert horovod.spark.run is horovodish.spark.run\n"
            "assert horovod.spark.run_elastic is horovodish.spark.run_elastic\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, **alias_env()})
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("np", [2, 3])
def test_horovod_torch_script(np):
    result = run_ranks(WORKERS / "horovod_torch_script.py", np, env=alias_env(), timeout=120)
    assert_ranks_ok(result, np, [
        "the_alias_is_horovodish", "sparse_handle_is_callable",
        "prescale_is_horovods_arithmetic", "reducescatter_gradient_is_horovods",
        "optimizer_names_parameters", "broadcast_state_with_a_frozen_parameter"])


def test_horovod_tensorflow_script():
    result = run_ranks(WORKERS / "horovod_tensorflow_script.py", 2, env=alias_env(),
                       timeout=180)
    assert_ranks_ok(result, 2, [
        "graph_mode_broadcast_global_variables", "graph_mode_broadcast_gradient_does_not_hang",
        "graph_mode_mismatch_is_failed_precondition", "eager_uint16_collectives",
        "eager_mismatch_is_failed_precondition", "monitored_training_session"])


def test_horovodrun_is_horovodishrun_once_its_directory_is_on_path():
    """Job files written for Horovod call ``horovodrun``: with the directory that
    ``python -m horovodish.compat --bin`` prints on PATH (opt-in), it starts the job as
    horovodishrun does, and a Horovod script through the alias reduces across ranks."""
    directory = subprocess.run([sys.executable, "-m", "horovodish.compat", "--bin"],
                               capture_output=True, text=True, check=True).stdout.strip()
    launcher = Path(directory) / "horovodrun"
    assert os.access(launcher, os.X_OK)
    assert launcher.read_text().startswith(f"#!{sys.executable}\n")
    code = ("import torch, horovod.torch as hvd; hvd.init(); "
            "total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum); "
            "print(f'RANK {hvd.rank()} OF {hvd.size()} SUM {float(total)}', flush=True)")
    env = {**os.environ, **alias_env(),
           "PATH": os.pathsep.join([directory, os.environ.get("PATH", "")])}
    result = subprocess.run(["horovodrun", "-np", "2", sys.executable, "-c", code],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(2):
        assert f"RANK {rank} OF 2 SUM 3.0" in result.stdout, result.stdout + result.stderr
