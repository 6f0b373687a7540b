"""The public allreduce paths the bench times: each a factory of one synchronous call
(for the size sweep) and of one burst (async submits, then waits), by framework."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..common.api import collectives
from ..common.messages import ReduceOp
from .timing import Contender

# name -> (one call on a buffer of nbytes, a burst over count tensors of nbytes each)
Path = tuple[Callable[[int, str], Contender], Callable[[int, int, str], Contender]]


def _core_call(nbytes: int, name: str) -> Contender:
    buf = np.zeros(nbytes // 4, dtype=np.float32)  # zeros: repeated sums never overflow
    return lambda: collectives.allreduce_async(buf, buf, name, ReduceOp.SUM, waited=True).wait()


def _core_burst(count: int, nbytes: int, name: str) -> Contender:
    tensors = [np.zeros(nbytes // 4, dtype=np.float32) for _ in range(count)]
    names = [f"{name}.{i}" for i in range(count)]

    def burst() -> None:
        handles = [collectives.allreduce_async(t, t, n, ReduceOp.SUM)
                   for t, n in zip(tensors, names)]
        for handle in handles:
            handle.wait()
    return burst


def _torch_paths() -> dict[str, Path]:
    import torch

    from .. import torch as hvd

    def call(in_place: bool) -> Callable[[int, str], Contender]:
        def make(nbytes: int, name: str) -> Contender:
            tensor = torch.zeros(nbytes // 4)
            if in_place:
                return lambda: hvd.allreduce_(tensor, name=name, op=hvd.Sum)
            return lambda: hvd.allreduce(tensor, name=name, op=hvd.Sum)
        return make

    def burst(in_place: bool) -> Callable[[int, int, str], Contender]:
        def make(count: int, nbytes: int, name: str) -> Contender:
            tensors = [torch.zeros(nbytes // 4) for _ in range(count)]
            names = [f"{name}.{i}" for i in range(count)]
            submit = hvd.allreduce_async_ if in_place else hvd.allreduce_async

            def run() -> None:
                handles = [submit(t, name=n, op=hvd.Sum) for t, n in zip(tensors, names)]
                for handle in handles:
                    hvd.synchronize(handle)
            return run
        return make
    return {"torch allreduce_": (call(True), burst(True)),
            "torch allreduce": (call(False), burst(False))}


def _tensorflow_paths() -> dict[str, Path]:
    import tensorflow as tf

    from .. import tensorflow as hvd

    def call(nbytes: int, name: str) -> Contender:
        tensor = tf.zeros([nbytes // 4])
        return lambda: hvd.allreduce(tensor, name=name, op=hvd.Sum)

    def burst(count: int, nbytes: int, name: str) -> Contender:
        tensors = [tf.zeros([nbytes // 4]) for _ in range(count)]
        return lambda: hvd.grouped_allreduce(tensors, name=name, op=hvd.Sum)
    return {"tensorflow allreduce": (call, burst)}


def available(frameworks: list[str]) -> dict[str, Path]:
    """The core path, and each framework's whose package imports."""
    paths: dict[str, Path] = {"core in place": (_core_call, _core_burst)}
    loaders = {"torch": _torch_paths, "tensorflow": _tensorflow_paths}
    for framework in frameworks:
        if framework not in loaders:  # no allreduce path of its own to time (jax)
            continue
        try:
            paths.update(loaders[framework]())
        except ImportError:
            continue
    return paths
