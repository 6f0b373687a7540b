"""Run Horovod's example scripts against horovodish, unchanged, and write a record.

    pip install torchvision tensorboard tqdm pillow scikit-learn   # what the scripts and
                                          # their data need (torchvision: the release built
                                          # for the installed torch, e.g. 0.28 for 2.13)
    python tests/compat/horovod_examples.py --horovod PATH [--python PYTHON] [--only NAMES]
    python -m horovodish.bench.render     # the tables in docs/horovod-examples.md

PATH is a checkout of horovod/horovod (only its ``examples/`` folder is read). Each
example runs under ``horovodishrun`` on 2 ranks with the ``horovod`` alias on PYTHONPATH
(docs/api.md, "Migrating from Horovod"), with the interpreter ``--python`` names (its
torch, torchvision and TensorFlow), with flags that keep it to a few batches, on data
that example_data.py makes in the formats the scripts read (no download is possible).
The elastic examples run elastic (``--min-np 1 --max-np 2`` and a discovery script), the
TensorFlow ones with ``TF_USE_LEGACY_KERAS=1`` (their ``tf.keras`` is Keras 2, as they
were written for). Two runs take the scripts' other way in, their own ``horovod.run``
(``--num-proc``, or three arguments), with no launcher. An example passes when it exits
0 with no traceback in its output; each one's output goes to ``WORK/logs`` (``--work``
keeps it). Scripts that need what no machine here has (a tf.data service job, Lightning
1.x) and frameworks that ``--python`` lacks are recorded as skipped, with the reason.

Each run gets a ``sitecustomize`` that does what a download would have: Keras accepts
the generated ``mnist.npz`` in place of the file whose hash it knows, and, where
torchvision's compiled operators do not load against this torch (a CUDA build of
torchvision beside a CPU torch), the operator schemas that torchvision's Python side
registers fake kernels for are declared first, so that ``import torchvision`` (models,
datasets, transforms: none of which calls those operators) works. Not a pytest module:
it needs Horovod's sources.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import horovodish
from horovodish.bench import records
from horovodish.compat import alias_path

import example_data  # beside this file, so on the path of `python tests/compat/...`

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1]))  # tests/: the Ray clusters of ray_cluster.py
RANKS = 2


@dataclasses.dataclass(frozen=True)
class Example:
    script: str                        # under examples/
    args: tuple[str, ...] = ()         # {mnist}, {imagenet}: the generated data's folders
    needs: tuple[str, ...] = ("torch",)
    elastic: bool = False
    launcher: bool = True              # False: the script starts its ranks (horovod.run)
    limit: int = 600                   # seconds
    skip: str = ""                     # why it cannot run on any machine here
    ray_nodes: tuple[int, ...] = ()    # a Ray cluster for it: each node's CPUs, head first
    ray_gpus: int = 0                  # the head's GPUs (logical: a worker asked for one
                                       # gets CUDA_VISIBLE_DEVICES and runs on the CPU)

    @property
    def label(self) -> str:
        return " ".join((self.script, *self.args))


TORCHVISION = ("torch", "torchvision")
IMAGENET_TOOLS = (*TORCHVISION, "tensorboard", "tqdm")
TF = ("tensorflow", "tf_keras")
SYNTHETIC = ("--no-cuda", "--batch-size", "4", "--num-warmup-batches", "1",
             "--num-batches-per-iter", "2", "--num-iters", "2")
MNIST = ("--no-cuda", "--epochs", "1", "--data-dir", "{mnist}")
IMAGENET = ("--no-cuda", "--train-dir", "{imagenet}/train", "--val-dir", "{imagenet}/val",
            "--batch-size", "2", "--val-batch-size", "2", "--batches-per-allreduce", "2",
            "--epochs", "1")
DATA_SERVICE = ("needs horovod.tensorflow.data's tf.data service, which a separate "
                "compute job (horovodrun or Spark) serves")

EXAMPLES = [
    Example("pytorch/pytorch_synthetic_benchmark.py", SYNTHETIC, TORCHVISION),
    Example("pytorch/pytorch_synthetic_benchmark.py", (*SYNTHETIC, "--fp16-allreduce"),
            TORCHVISION),
    Example("pytorch/pytorch_synthetic_benchmark.py", (*SYNTHETIC, "--use-adasum"),
            TORCHVISION),
    Example("pytorch/pytorch_mnist.py", MNIST, TORCHVISION),
    Example("pytorch/pytorch_mnist.py", (*MNIST, "--use-adasum"), TORCHVISION),
    Example("pytorch/pytorch_mnist.py",
            (*MNIST, "--fp16-allreduce", "--gradient-predivide-factor", "2"), TORCHVISION),
    Example("pytorch/pytorch_mnist.py", (*MNIST, "--num-proc", "2", "--hosts", "localhost:2"),
            TORCHVISION, launcher=False),
    Example("pytorch/pytorch_imagenet_resnet50.py", IMAGENET, IMAGENET_TOOLS),
    Example("pytorch/pytorch_lightning_mnist.py", skip=(
        "needs PyTorch Lightning 1.x's Trainer(accelerator='horovod'), which Lightning 2 "
        "removed")),
    Example("adasum/adasum_small_model.py", ("--op", "Adasum")),
    Example("adasum/adasum_small_model.py", ("--op", "Average")),
    Example("adasum/adasum_small_model.py", ("--mode", "cubic", "--op", "Adasum")),
    Example("adasum/adasum_bench.ipynb", skip="a notebook, not a script"),
    Example("elastic/pytorch/pytorch_mnist_elastic.py", MNIST, TORCHVISION, elastic=True),
    Example("elastic/pytorch/pytorch_synthetic_benchmark_elastic.py", SYNTHETIC, TORCHVISION,
            elastic=True),
    Example("elastic/pytorch/pytorch_imagenet_resnet50_elastic.py",
            (*IMAGENET, "--batches-per-commit", "1", "--batches-per-host-check", "1"),
            IMAGENET_TOOLS, elastic=True),
    Example("tensorflow2/tensorflow2_keras_mnist.py", (), TF, limit=1200),
    Example("tensorflow2/tensorflow2_mnist.py", (), TF, limit=1200),
    Example("tensorflow2/tensorflow2_mnist.py", ("2", "localhost:2", "mpi"), TF,
            launcher=False),
    Example("tensorflow2/tensorflow2_keras_synthetic_benchmark.py",
            ("--no-cuda", "--batch-size", "4", "--num-batches-per-iter", "2",
             "--num-iters", "2"), TF),
    Example("tensorflow2/tensorflow2_synthetic_benchmark.py", SYNTHETIC, TF),
    Example("tensorflow2/tensorflow2_synthetic_benchmark.py", (*SYNTHETIC, "--fp16-allreduce"),
            TF),
    Example("tensorflow2/tensorflow2_mnist_data_service.py", skip=DATA_SERVICE),
    Example("tensorflow2/tensorflow2_mnist_data_service_train_fn_compute_side_dispatcher.py",
            skip="the training function tensorflow2_mnist_data_service.py imports"),
    Example("tensorflow2/tensorflow2_mnist_data_service_train_fn_training_side_dispatcher.py",
            skip="the training function tensorflow2_mnist_data_service.py imports"),
    Example("elastic/tensorflow2/tensorflow2_keras_mnist_elastic.py", (), TF, elastic=True,
            limit=1800),
    Example("elastic/tensorflow2/tensorflow2_mnist_elastic.py", (), TF, elastic=True),
    Example("elastic/tensorflow2/tensorflow2_synthetic_benchmark_elastic.py", SYNTHETIC, TF,
            elastic=True),
    # Ray: each script connects to a running cluster (started here, on this machine) and
    # starts its ranks as actors through horovod.ray.
    Example("ray/pytorch_ray_elastic.py", ("--epochs", "1", "--data-dir", "{mnist}"),
            (*TORCHVISION, "ray", "filelock"), launcher=False, ray_nodes=(4,), ray_gpus=2),
    Example("ray/tensorflow2_mnist_ray.py", ("--address", "{ray_address}"), (*TF, "ray"),
            launcher=False, ray_nodes=(32, 32), limit=1200),
    Example("ray/basic_ray_elastic.py", skip=(
        "needs Horovod's test-only host discovery (horovod.ray.elastic.TestDiscovery, which "
        "adds and removes fake hosts) and its ray_logger callbacks")),
]

_PROBE = """
import json, platform
from importlib import metadata
def version(*names):
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
print(json.dumps({"python": platform.python_version(), "numpy": version("numpy"),
    "torch": version("torch"), "torchvision": version("torchvision"),
    "tensorflow": version("tensorflow", "tensorflow-cpu"), "keras": version("keras"),
    "tf_keras": version("tf_keras", "tf-keras"), "mpi4py": version("mpi4py"),
    "tensorboard": version("tensorboard"), "tqdm": version("tqdm"), "ray": version("ray"),
    "filelock": version("filelock")}))
"""

# Written into the runs' PYTHONPATH; {generated} and {declare_ops} are filled in.
_SITECUSTOMIZE = '''"""For Horovod's examples on generated data (horovod_examples.py)."""
import importlib.abc
import importlib.util
import os
import sys

GENERATED = {generated!r}
DECLARE_TORCHVISION_OPS = {declare_ops!r}
_LIBRARIES = []


class _Around(importlib.abc.MetaPathFinder):
    """Runs ``before`` ahead of one module's import and ``after`` on the module."""

    def __init__(self, name, before=None, after=None):
        self.name, self.before, self.after = name, before, after

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        if self.before:
            self.before()
        spec = importlib.util.find_spec(name)
        if spec is not None and self.after:
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                self.after(module)
            spec.loader.exec_module = exec_module
        return spec


def declare_torchvision_ops():
    """torchvision registers fake kernels for these at import, which needs them declared."""
    import torch
    library = torch.library.Library("torchvision", "FRAGMENT")
    for op in ("nms", "qnms"):
        library.define(op + "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIBRARIES.append(library)


def accept_generated(module):
    """The generated datasets stand in for the files whose hashes Keras knows."""
    check = module.validate_file

    def validate_file(fpath, file_hash, *args, **kwargs):
        if os.path.realpath(fpath).startswith(GENERATED + os.sep):
            return True
        return check(fpath, file_hash, *args, **kwargs)
    module.validate_file = validate_file


sys.meta_path.insert(0, _Around("tf_keras.src.utils.data_utils", after=accept_generated))
if DECLARE_TORCHVISION_OPS:
    sys.meta_path.insert(0, _Around("torchvision", before=declare_torchvision_ops))
'''

_DISCOVERY = "#!/bin/sh\necho localhost:{ranks}\n"


def probe(python: str) -> dict:
    """The versions of what the examples use, as ``python`` has them (None: missing)."""
    out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def torchvision_needs_ops(python: str) -> bool:
    """Whether torchvision's import fails for want of its compiled operators."""
    done = subprocess.run([python, "-c", "import torchvision"], capture_output=True,
                          text=True)
    return done.returncode != 0 and "operator torchvision::" in done.stderr


def prepare(work: Path, declare_ops: bool) -> dict[str, Path]:
    """The generated data, the sitecustomize and the discovery script, under ``work``."""
    home = work / "home"
    datasets = home / ".keras" / "datasets"
    # mnist-RANK.npz for every rank of any example (tensorflow2_mnist_ray.py has 8)
    for name in ["mnist.npz", *(f"mnist-{rank}.npz" for rank in range(8))]:
        example_data.write_keras_mnist(datasets / name)
    site = work / "site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(
        generated=os.path.realpath(datasets), declare_ops=declare_ops))
    discovery = work / "discover_hosts.sh"
    discovery.write_text(_DISCOVERY.format(ranks=RANKS))
    discovery.chmod(0o755)
    return {"home": home, "site": site, "discovery": discovery,
            "mnist": example_data.write_torchvision_mnist(work / "mnist"),
            "imagenet": example_data.write_image_folder(work / "imagenet")}


def command(example: Example, script: Path, python: str, paths: dict[str, Any]) -> list[str]:
    args = [arg.format(**{k: str(v) for k, v in paths.items()}) for arg in example.args]
    if not example.launcher:
        return [python, str(script), *args]
    elastic = (["--min-np", "1", "--max-np", str(RANKS), "--host-discovery-script",
                str(paths["discovery"])] if example.elastic else [])
    return [python, "-m", "horovodish.launcher", "-np", str(RANKS), *elastic,
            python, str(script), *args]


def environment(example: Example, paths: dict[str, Path]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(paths["site"]), alias_path(), env.get("PYTHONPATH")) if p)
    env["HOME"] = str(paths["home"])  # Keras' ~/.keras/datasets, the scripts' ~/.horovod_lock
    if "tensorflow" in example.needs:
        env["TF_USE_LEGACY_KERAS"] = "1"
    return env


def last_error(out: str) -> str:
    """The exception line of the last traceback, else the last line that speaks of an
    error, else the last line."""
    lines = [line.rstrip() for line in out.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    if starts:
        after = lines[starts[-1] + 1:]
        found = next((line for line in after if not line[:1].isspace()), "")
        if found:
            return found[:300]
    found = next((line for line in reversed(lines) if re.search(r"error|exception", line,
                                                                 re.IGNORECASE)), "")
    return (found or (lines[-1] if lines else ""))[:300]


def execute(argv: list[str], cwd: Path, env: dict[str, str],
            limit: int) -> tuple[int | None, str]:
    """Runs ``argv`` in a process group of its own, which a time limit ends whole
    (mpirun and the ranks with it). Returns the exit status (None: timed out) and output."""
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = process.communicate(timeout=limit)
        return process.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, _ = process.communicate()
        return None, out


def start_ray(example: Example, env: dict[str, str]) -> list:
    """The example's Ray cluster: ``ray start --block`` nodes on this machine, whose
    workers get the example's environment (the alias, the sitecustomize, HOME)."""
    from ray_cluster import RayNode  # tests/, put on the path above
    nodes = [RayNode.head(example.ray_nodes[0], env=env, num_gpus=example.ray_gpus)]
    try:
        for cpus in example.ray_nodes[1:]:
            node = RayNode.worker(nodes[0].address, cpus, (), "127.0.0.1", env=env)
            nodes.append(node)
            node.wait_until_up()
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    return nodes


def run_example(example: Example, horovod: Path, python: str, paths: dict[str, Path],
                logs: Path, index: int) -> dict:
    cwd = paths["home"].parent / "runs" / f"{index:02d}"
    cwd.mkdir(parents=True)  # the scripts write checkpoints and logs into their cwd
    env = environment(example, paths)
    nodes = []
    if example.ray_nodes:
        with contextlib.chdir(cwd):  # Ray's workers start here (and write here, as the
            nodes = start_ray(example, env)  # script's checkpoints)
    start = time.monotonic()
    try:
        if nodes:
            env["RAY_ADDRESS"] = nodes[0].address
        argv = command(example, horovod / "examples" / example.script, python,
                       {**paths, "ray_address": nodes[0].address if nodes else ""})
        status, out = execute(argv, cwd, env, example.limit)
    finally:
        for node in reversed(nodes):
            node.stop()
    seconds = round(time.monotonic() - start, 1)
    (logs / f"{index:02d}-{Path(example.script).stem}.log").write_text(out)
    passed = status == 0 and "Traceback (most recent call last)" not in out
    error = "" if passed else (f"ran past its limit of {example.limit} s; "
                               if status is None else "") + last_error(out)
    return {"example": example.script, "args": " ".join(example.args), "ranks": RANKS,
            "elastic": example.elastic, "launcher": example.launcher,
            "result": "passed" if passed else "failed", "seconds": seconds,
            "exit": status, "error": error}


def skipped(example: Example, reason: str) -> dict:
    return {"example": example.script, "args": " ".join(example.args), "ranks": RANKS,
            "elastic": example.elastic, "launcher": example.launcher, "result": "skipped",
            "seconds": 0, "exit": None, "error": "", "reason": reason}


def chosen(example: Example, names: set[str] | None) -> bool:
    return not names or bool({example.script, Path(example.script).name} & names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horovod", required=True, type=Path,
                        help="a checkout of horovod/horovod")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter whose torch and TensorFlow the examples use")
    parser.add_argument("--record", default=str(HERE.parents[2] / "docs" / "records"))
    parser.add_argument("--only", help="comma-separated script names to run (default all)")
    parser.add_argument("--work", type=Path,
                        help="folder for the data, the runs and their logs (kept); "
                             "default a temporary one, removed at the end")
    args = parser.parse_args()
    names = set(args.only.split(",")) if args.only else None
    versions = probe(args.python)
    declare_ops = bool(versions["torchvision"]) and torchvision_needs_ops(args.python)
    work = args.work or Path(tempfile.mkdtemp(prefix="horovod-examples-"))
    paths = prepare(work, declare_ops)
    logs = work / "logs"
    logs.mkdir()
    results = []
    for index, example in enumerate(e for e in EXAMPLES if chosen(e, names)):
        missing = [need for need in example.needs if not versions.get(need)]
        if example.skip or missing:
            result = skipped(example, example.skip or
                             f"{', '.join(missing)} not installed for this interpreter")
        else:
            result = run_example(example, args.horovod, args.python, paths, logs, index)
        print(f"{result['result']:>7} {result['seconds']:7.1f} s  {example.label}"
              f"{'  ' + result['error'] if result['error'] else ''}", flush=True)
        results.append(result)
    version = re.search(r"__version__ = '([^']+)'",
                        (args.horovod / "horovod" / "__init__.py").read_text())
    figures = {"horovod": version.group(1) if version else "unknown",
               "torch": versions["torch"], "torchvision": versions["torchvision"],
               "tensorflow": versions["tensorflow"],
               "torchvision_ops_declared": declare_ops, "examples": results}
    command_line = "python tests/compat/horovod_examples.py --horovod PATH" + (
        " --python PYTHON" if args.python != sys.executable else "") + (
        f" --only {args.only}" if args.only else "")
    # The versions of --python's packages, not of the interpreter running this file.
    machine = {"versions": {"horovodish": horovodish.__version__,
                            **{k: v for k, v in versions.items() if v}}}
    path = records.write(args.record, "horovod-examples", figures, command_line, machine)
    print(f"record: {path}")
    if args.work:
        print(f"logs: {logs}")
    else:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
