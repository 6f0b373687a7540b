"""A Ray driver for the tests: connects to a running cluster, runs one scenario, checks
its results against the references of tests/ray_spark_jobs.py, and prints one line
``RESULT {json}`` (``problems``: what differed; empty when all is right).

    python ray_driver.py ADDRESS executor --workers 2 [--via-horovod]
    python ray_driver.py ADDRESS executor --hosts 2 --per-host 2
    python ray_driver.py ADDRESS infeasible --workers 3
    python ray_driver.py ADDRESS elastic LOG_DIR | grow LOG_DIR | elastic-executor
    python ray_driver.py ADDRESS train-horovodish | train-torch
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import ray

import ray_spark_jobs as jobs



def executor(args: argparse.Namespace) -> dict:
    if args.via_horovod:  # Horovod's import, through the compat alias
        from horovod.ray import RayExecutor
    else:
        from horovodish.ray import RayExecutor
    settings = RayExecutor.create_settings(timeout_s=60)
    if args.hosts:
        ex = RayExecutor(settings, num_hosts=args.hosts, num_workers_per_host=args.per_host)
    else:
        ex = RayExecutor(settings, num_workers=args.workers)
    ex.start(executable_cls=Counter, executable_args=[10])
    try:
        places = ex.run(jobs.collectives)
        problems = jobs.collective_problems(places)
        if args.via_horovod:
            alike = ex.run(jobs.horovod_style)
            problems += [] if alike == [(r, len(places), [3.0, 3.0]) for r in
                                        range(len(places))] else [f"horovod_style {alike}"]
        weights = ex.run(jobs.torch_training)
        want = jobs.reference_weights(len(weights))
        problems += [f"rank {r}: weights {w}, want {want}" for r, w in enumerate(weights)
                     if not np.allclose(w, want, rtol=1e-10, atol=1e-12)]
        refs = ex.run_remote(lambda k: k * 2, args=[21])
        problems += [] if ray.get(refs) == [42] * len(places) else [f"run_remote {refs}"]
        counted = ex.execute(lambda counter: counter.add())
        problems += [] if counted == [11] * len(places) else [f"execute {counted}"]
        single = ex.execute_single(lambda counter: counter.add())
        problems += [] if single == 12 else [f"execute_single {single}"]
    finally:
        ex.shutdown()
    return {"problems": problems,
            "places": [{k: p[k] for k in ("rank", "host", "local_rank", "local_size",
                                          "cross_rank", "cross_size")} for p in places]}


class Counter:
    """An executable: state that lives in each worker between calls."""

    def __init__(self, start: int) -> None:
        self.value = start

    def add(self) -> int:
        self.value += 1
        return self.value


def infeasible(args: argparse.Namespace) -> dict:
    """More workers than the cluster has CPUs: start() times out, shutdown() still works."""
    from horovodish.ray import RayExecutor
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=30, placement_group_timeout_s=3),
                     num_workers=args.workers)
    try:
        ex.start()
        problems = ["start() did not time out"]
    except TimeoutError as exc:
        problems = [] if "Placement group creation timed out" in str(exc) else [str(exc)]
    ex.shutdown()
    return {"problems": problems}


def elastic(args: argparse.Namespace) -> dict:
    """The elastic digits job (tests/torch/workers/elastic_digits_worker.py) on 2 workers,
    rank 1 SIGKILLed after step 12 of the first generation."""
    from horovodish.ray import RayExecutor
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), min_workers=1,
                     max_workers=2, reset_limit=2)
    ex.start()
    results = ex.run(jobs.elastic_digits, args=[args.log_dir, "--kill", "1", "12"])
    ex.shutdown()
    return {"problems": [] if results == ["done", "done"] else [f"results {results}"],
            "generations": ex.elastic.generations}


def elastic_executor(args: argparse.Namespace) -> dict:
    """Horovod's older elastic executor as its examples/ray/pytorch_ray_elastic.py uses
    it, through the alias: ElasticRayExecutor(use_gpu=True, cpus_per_slot=1) on a head
    with 2 logical GPUs, one slot per GPU; as in Horovod, every worker of a node sees all
    the GPUs Ray gave that node's workers (and picks its own by local_rank)."""
    from horovod.ray import ElasticRayExecutor
    settings = ElasticRayExecutor.create_settings(verbose=True)
    ex = ElasticRayExecutor(settings, use_gpu=True, cpus_per_slot=1)
    ex.start()
    results = ex.run(jobs.gpu_slot_training)
    problems = []
    devices = [device for device, _, _ in results]
    # Both GPUs on each worker, listed alike on both (each picks its own by local rank);
    # in the order Ray gave them to the workers, which varies from run to run.
    if len(results) != 2 or len(set(devices)) != 1 or \
            sorted((devices[0] or "").split(",")) != ["0", "1"]:
        problems.append(f"workers' CUDA_VISIBLE_DEVICES {devices}, want both GPUs on each, "
                        "listed alike")
    alike = [style for _, style, _ in results]
    if alike != [(r, 2, [3.0, 3.0]) for r in range(2)]:
        problems.append(f"collectives {alike}")
    want = jobs.reference_weights(2)
    problems += [f"rank {r}: weights {w}, want {want}" for r, (_, _, w) in enumerate(results)
                 if not np.allclose(w, want, rtol=1e-10, atol=1e-12)]
    return {"problems": problems}


class FileDiscovery:
    """Horovod's discovery interface over a file of ``ip:slots`` lines."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        return {line.rsplit(":", 1)[0]: int(line.rsplit(":", 1)[1])
                for line in self.path.read_text().split()}


def grow(args: argparse.Namespace) -> dict:
    """The elastic digits job starting on 1 worker; after step 8 rank 0 writes a second
    slot into the discovery's file, and the job goes on with 2 from its next commit."""
    from horovodish.ray import RayExecutor
    settings = RayExecutor.create_settings(timeout_s=60)
    hosts = Path(args.log_dir) / "hosts.txt"
    ip = ray.util.get_node_ip_address()
    hosts.write_text(f"{ip}:1\n")
    settings.discovery = FileDiscovery(hosts)
    ex = RayExecutor(settings, min_workers=1, max_workers=2, override_discovery=False)
    ex.start()
    results = ex.run(jobs.elastic_digits,
                     args=[args.log_dir, "--grow", str(hosts), f"{ip}:2", "8"])
    ex.shutdown()
    return {"problems": [] if results == ["done", "done"] else [f"results {results}"],
            "generations": ex.elastic.generations}


def train(args: argparse.Namespace) -> dict:
    """The main job's model (examples/pytorch_digits.py) under Ray Train: our backend
    in DataParallelTrainer, or TorchTrainer with hvd.init() in the loop."""
    import ray.train
    from ray.train import RunConfig, ScalingConfig

    def loop(config: dict) -> None:
        import tempfile

        import pytorch_digits

        import horovodish.torch as hvd
        hvd.init()
        accuracy, _ = pytorch_digits.train(pytorch_digits.parse_args(["--epochs", "20"]))
        with tempfile.TemporaryDirectory() as folder:
            Path(folder, f"rank{hvd.rank()}.json").write_text(json.dumps(accuracy))
            ray.train.report({"accuracy": accuracy, "size": hvd.size()},
                             checkpoint=ray.train.Checkpoint.from_directory(folder))
    scaling = ScalingConfig(num_workers=2)
    run = RunConfig(name=args.scenario, storage_path=args.storage)
    if args.scenario == "train-horovodish":
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

        from horovodish.ray import HorovodishConfig
        trainer = DataParallelTrainer(loop, backend_config=HorovodishConfig(),
                                      scaling_config=scaling, run_config=run)
    else:
        from ray.train.torch import TorchTrainer
        trainer = TorchTrainer(loop, scaling_config=scaling, run_config=run)
    result = trainer.fit()
    files = sorted(os.listdir(result.checkpoint.to_directory()))
    problems = [] if files == ["rank0.json", "rank1.json"] else [f"checkpoint {files}"]
    return {"problems": problems, "metrics": result.metrics}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("scenario")
    parser.add_argument("log_dir", nargs="?")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--hosts", type=int)
    parser.add_argument("--per-host", type=int, default=1)
    parser.add_argument("--storage", default="/tmp")
    parser.add_argument("--via-horovod", action="store_true",
                        help="import RayExecutor as horovod.ray's (the compat alias)")
    args = parser.parse_args()
    # With the compat alias, the workers get the driver's PYTHONPATH (its directory) as
    # a Ray job passes its environment on: through the job's runtime_env.
    runtime_env = {"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}} \
        if args.via_horovod or args.scenario == "elastic-executor" else None
    ray.init(address=args.address, log_to_driver=True, runtime_env=runtime_env)
    run = {"executor": executor, "elastic": elastic, "grow": grow,
           "infeasible": infeasible,
           "elastic-executor": elastic_executor}.get(args.scenario, train)
    outcome = run(args)
    print("RESULT " + json.dumps(outcome, default=str), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
