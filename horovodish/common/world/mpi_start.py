"""MPI started once the world is known: at import where an MPI process manager started
the job (mpi4py's default), in ``init()`` where another launcher did.

``defer_import_start`` runs when ``horovodish`` is imported: under a launcher of
``launch_env`` it tells mpi4py not to start MPI at import (and to finalize it at exit),
so that ``start_mpi`` can first make this rank a client of the job's PMI server. Calls
that need no running MPI (``mpi4py.MPI.Get_library_version``, horovodish's build checks)
work before ``init()`` either way.
"""
from __future__ import annotations

import os
import sys
import time

from . import launch_env, membership, rendezvous
from .launch_env import Launch

# MPI libraries whose PMI-1 client takes PMI_FD (MPICH and those built on it).
MPICH_FAMILY = ("MPICH", "Intel(R) MPI", "MVAPICH")
_PMI_VARIABLES = ("PMI_FD", "PMI_RANK", "PMI_SIZE")
_joined: Launch | None = None   # the launch this process's MPI world was formed for
_server = None                  # the PMI server this process started (rank 0), kept alive


def defer_import_start(environ: os._Environ | dict) -> None:
    """Keep mpi4py from starting MPI at import when a non-MPI launcher started a job of
    several ranks (a no-op when mpi4py.MPI is imported already: init() then says so)."""
    launch = launch_env.detect(environ)
    if launch is None or launch.size <= 1 or "mpi4py.MPI" in sys.modules:
        return
    try:
        import mpi4py
    except ImportError:
        return
    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = True


def start_mpi(start_timeout: float) -> Launch | None:
    """Make sure MPI runs, in the job's world: the launch this rank joined through the
    PMI server, or None when MPI formed the world itself (or there is one rank)."""
    from mpi4py import MPI
    launch = launch_env.detect(os.environ)
    if MPI.Is_initialized():
        if launch is not None and launch.size > 1 and _joined is None and \
                MPI.COMM_WORLD.Get_size() == 1:
            raise RuntimeError(
                f"horovodish.init(): {launch.launcher} started this job as {launch.size} "
                "tasks, but mpi4py.MPI was imported before horovodish and started MPI as "
                "a world of one, so this rank cannot join the others. Import horovodish "
                "(import horovodish.torch as hvd, say) before mpi4py.MPI, or set "
                "mpi4py.rc.initialize = False before importing it.")
        return _joined
    if launch is None or launch.size <= 1:
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
        return None
    library = " ".join(MPI.Get_library_version().splitlines()[0].split())
    if not any(name in library for name in MPICH_FAMILY):
        raise RuntimeError(
            f"horovodish.init(): {launch.launcher} started this job as {launch.size} "
            f"tasks, and horovodish joins them into one MPI world through MPICH's PMI-1 "
            f"interface, but mpi4py uses {library}, which has no such client. Use MPICH "
            "(pip install mpich, then reinstall mpi4py: pip install --force-reinstall "
            "--no-cache-dir mpi4py), or start the job with that MPI's own mpirun.")
    return _join(launch, start_timeout, MPI)


def _join(launch: Launch, start_timeout: float, MPI) -> Launch:
    global _joined, _server
    deadline = time.monotonic() + start_timeout
    meeting = rendezvous.meet(launch, start_timeout, deadline)
    _server = meeting.server
    place = membership.join(meeting.addresses, meeting.key, launch.rank, launch.size,
                            deadline, launch.launcher)
    os.environ.update(PMI_FD=str(place.fd), PMI_RANK=str(launch.rank),
                      PMI_SIZE=str(launch.size))
    try:
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    finally:
        # Read by MPI_Init only; a child process (a data loader's, say) must not take
        # them for an MPI process manager's.
        for variable in _PMI_VARIABLES:
            os.environ.pop(variable, None)
    size = MPI.COMM_WORLD.Get_size()
    if size != launch.size or MPI.COMM_WORLD.Get_rank() != launch.rank:
        MPI.COMM_WORLD.Abort(1)  # (cannot happen with a PMI server of ours; never train so)
    _joined = launch
    return launch
