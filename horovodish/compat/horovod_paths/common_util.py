"""Horovod import path (a shim): Horovod's ``horovod.common.util`` helpers, for scripts and test suites that import them.

Horovod's own test suites and some training scripts import these (``env`` to set
variables around ``init()``, ``is_version_greater_equal_than`` to branch on
TensorFlow's version, ``*_built`` to skip what a build lacks). Through the alias
(``python -m horovodish.compat``) ``horovod.common.util`` is this module. horovodish has
no compiled extensions: an "extension" is available when its framework imports and the
horovodish adapter for it exists.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence, TypeVar

from ...common.api import process_state

T = TypeVar("T")

# Horovod's extension names -> the framework each needs (mxnet has no adapter here).
_FRAMEWORKS = {"torch": "torch", "tensorflow": "tensorflow", "keras": "keras"}


def _cache(function: Callable[..., T]) -> Callable[..., T]:
    """Compute once per arguments (Horovod caches its build probes this way)."""
    return functools.lru_cache(maxsize=None)(function)


def _framework(ext_base_name: str) -> str | None:
    """'horovod.torch', 'torch' -> 'torch'; None for a framework horovodish lacks."""
    name = ext_base_name.split(".")[-1]
    return _FRAMEWORKS.get(name)


def extension_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Whether horovodish supports this framework here (it has an adapter and the
    framework is installed)."""
    framework = _framework(ext_base_name)
    return framework is not None and importlib.util.find_spec(framework) is not None


def check_extension(ext_name: str, ext_env_var: str, pkg_path: str, *args: Any) -> None:
    """Raise ImportError when the framework's support is unavailable, naming it."""
    if not extension_available(ext_name):
        raise ImportError(f"{ext_name} support is unavailable: horovodish has no adapter "
                          f"for it, or its framework is not installed ({ext_env_var} "
                          "has no meaning here: horovodish builds nothing).")


def gpu_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Whether the framework sees a CUDA device that horovodish can use."""
    framework = _framework(ext_base_name)
    if framework is None or not extension_available(framework) or not cuda_built():
        return False
    if framework == "torch":
        import torch
        return bool(torch.cuda.is_available())
    import tensorflow as tf
    return bool(tf.config.list_physical_devices("GPU"))


def mpi_built(verbose: bool = False) -> bool:
    return process_state.mpi_built()


def gloo_built(verbose: bool = False) -> bool:
    return process_state.gloo_built()


def nccl_built(verbose: bool = False) -> int:
    return process_state.nccl_built()


def ddl_built(verbose: bool = False) -> bool:
    return process_state.ddl_built()


def ccl_built(verbose: bool = False) -> bool:
    return process_state.ccl_built()


def cuda_built(verbose: bool = False) -> bool:
    return process_state.cuda_built()


def rocm_built(verbose: bool = False) -> bool:
    return process_state.rocm_built()


@contextmanager
def env(**variables: str | None) -> Iterator[None]:
    """Set environment variables (None: leave that one alone) for the block, then put
    back what was there, removing those that were not."""
    chosen = {key: value for key, value in variables.items() if value is not None}
    before = {key: os.environ.get(key) for key in chosen}
    os.environ.update(chosen)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def get_average_backwards_compatibility_fun(reduce_ops: Any) -> Callable[[Any, Any], Any]:
    """impl(op, average): the op a call means, from Horovod's deprecated ``average=``
    or ``op=`` (both: ValueError; neither: Average). reduce_ops: where Average and Sum
    live (a framework module)."""
    def impl(op: Any, average: bool | None) -> Any:
        if op is not None:
            if average is not None:
                raise ValueError("pass either op= or average= (deprecated), not both")
            return op
        if average is None:
            return reduce_ops.Average
        warnings.warn("average= is deprecated: pass op=Average or op=Sum",
                      DeprecationWarning, stacklevel=2)
        return reduce_ops.Average if average else reduce_ops.Sum
    return impl


def num_rank_is_power_2(num_rank: int) -> bool:
    """Adasum's old requirement: a positive power of two."""
    return num_rank > 0 and num_rank & (num_rank - 1) == 0


def split_list(items: Sequence[T], parts: int) -> list[Sequence[T]]:
    """items in parts consecutive slices whose lengths differ by at most one (the
    longer ones first)."""
    base, extra = divmod(len(items), parts)
    bounds = [index * base + min(index, extra) for index in range(parts + 1)]
    return [items[start:stop] for start, stop in zip(bounds, bounds[1:])]


def is_iterable(value: Any) -> bool:
    try:
        iter(value)
    except TypeError:
        return False
    return True


def _release(version: str) -> tuple[int, ...]:
    """'2.16.1' -> (2, 16, 1); '2.17.0rc1' -> (2, 17, 0): the leading numbers only."""
    numbers = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
    return tuple(numbers)


@_cache
def is_version_greater_equal_than(ver: str, target: str) -> bool:
    """ver >= target, comparing release numbers (a pre-release counts as its release).
    target must be 'X.Y.Z', as Horovod requires."""
    if not isinstance(ver, str) or not isinstance(target, str):
        raise ValueError(f"versions must be strings, got {ver!r} ({type(ver).__name__}) "
                         f"and {target!r} ({type(target).__name__})")
    if len(target.split(".")) != 3:
        raise ValueError(f"target version {target!r} is not of the form 'X.Y.Z'")
    return _release(ver) >= _release(target)


__all__ = ["ccl_built", "check_extension", "cuda_built", "ddl_built", "env",
           "extension_available", "get_average_backwards_compatibility_fun", "gloo_built",
           "gpu_available", "is_iterable", "is_version_greater_equal_than", "mpi_built",
           "nccl_built", "num_rank_is_power_2", "rocm_built", "split_list"]
