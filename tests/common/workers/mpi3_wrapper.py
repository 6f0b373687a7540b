"""Run another worker as it would run on an MPI before MPI-4 (Open MPI 4.x): the
negotiation transport sees version 3.1 and takes its fallback, an Iallreduce a cycle on
a communicator of its own. Usage: mpi3_wrapper.py WORKER [ARGS...]."""
from __future__ import annotations

import runpy
import sys
from pathlib import Path

from mpi4py import MPI

MPI.Get_version = lambda: (3, 1)  # what Open MPI 4.1 reports
sys.argv = sys.argv[1:]
sys.path[0] = str(Path(sys.argv[0]).resolve().parent)  # as if the worker were run itself
runpy.run_path(sys.argv[0], run_name="__main__")
