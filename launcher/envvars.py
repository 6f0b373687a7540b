"""Flags -> ``HOROVODISH_*`` environment variables, the only channel to the ranks.

Why environment variables: the runtime reads its configuration from the environment (as
Horovod does), so a job started with plain ``mpirun`` behaves the same as one started here.
"""
from __future__ import annotations

import argparse
import os
from typing import Mapping

PREFIXES = ("HOROVODISH_", "HOROVOD_")


def _number(value: float) -> str:
    """``2.0`` -> ``"2"`` (so int() parsers accept it), ``2.5`` -> ``"2.5"``."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb"


def rank_defaults(environ: Mapping[str, str]) -> dict[str, str]:
    """What the ranks get unless the caller set it: transparent huge pages for large
    buffers (docs/tuning.md, "Huge pages"). Without them, MPI's transfers between
    processes ran at half speed or less here.

    - PyTorch's own switch for CPU tensors of 2 MiB and more (read at the first one).
      horovodish.torch sets it as well, for jobs started with plain mpirun; here it
      also covers a script that allocates large tensors before that import.
    - glibc's tunable that advises huge pages for what malloc maps: TensorFlow's
      tensors, MPI's own buffers. glibc reads it at process start only, so only a
      launcher can set it; added to GLIBC_TUNABLES unless that names it already
      (``glibc.malloc.hugetlb=0`` there turns it off)."""
    defaults = {}
    if "THP_MEM_ALLOC_ENABLE" not in environ:
        defaults["THP_MEM_ALLOC_ENABLE"] = "1"
    tunables = environ.get("GLIBC_TUNABLES", "")
    if HUGE_PAGES_TUNABLE not in tunables:
        defaults["GLIBC_TUNABLES"] = ":".join(filter(None, [tunables,
                                                            f"{HUGE_PAGES_TUNABLE}=1"]))
    return defaults


def config_env(args: argparse.Namespace) -> dict[str, str]:
    """The variables the given flags set; flags left unset produce nothing (runtime defaults)."""
    env: dict[str, str] = {}
    if args.fusion_threshold_mb is not None:
        env["HOROVODISH_FUSION_THRESHOLD"] = str(int(round(args.fusion_threshold_mb * 1024 * 1024)))
    if args.cycle_time_ms is not None:
        env["HOROVODISH_CYCLE_TIME"] = _number(args.cycle_time_ms)
    if args.cache_capacity is not None:
        env["HOROVODISH_CACHE_CAPACITY"] = str(args.cache_capacity)
    if args.timeline_filename is not None:
        # DYNAMIC is a mode (record between start_timeline and stop_timeline), not a file.
        env["HOROVODISH_TIMELINE"] = args.timeline_filename if \
            args.timeline_filename == "DYNAMIC" else os.path.abspath(args.timeline_filename)
    if args.timeline_mark_cycles:
        env["HOROVODISH_TIMELINE_MARK_CYCLES"] = "1"
    if args.stall_check_warning_time_seconds is not None:
        env["HOROVODISH_STALL_CHECK_TIME_SECONDS"] = _number(args.stall_check_warning_time_seconds)
    if args.stall_check_shutdown_time_seconds is not None:
        env["HOROVODISH_STALL_SHUTDOWN_TIME_SECONDS"] = _number(
            args.stall_check_shutdown_time_seconds)
    if args.no_stall_check:
        env["HOROVODISH_STALL_CHECK_DISABLE"] = "1"
    if args.autotune:
        env["HOROVODISH_AUTOTUNE"] = "1"
    if args.autotune_log_file is not None:
        env["HOROVODISH_AUTOTUNE_LOG"] = os.path.abspath(args.autotune_log_file)
    if args.log_level is not None:
        env["HOROVODISH_LOG_LEVEL"] = args.log_level
    if args.cpu_operations is not None:
        env["HOROVODISH_CPU_OPERATIONS"] = args.cpu_operations
    if args.gpu_operations is not None:
        env["HOROVODISH_GPU_OPERATIONS"] = args.gpu_operations
    for what in ("allreduce", "allgather"):
        chosen = getattr(args, f"hierarchical_{what}", None)
        if chosen is not None:
            env[f"HOROVODISH_HIERARCHICAL_{what.upper()}"] = "1" if chosen else "0"
    return env
