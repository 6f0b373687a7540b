"""Run another worker as if its ranks were on several hosts, as far as eager cycles go:
no shared-memory exchange, so their data travels in MPI's allgather with the bit vector
(negotiation/mpi_transport.py). Usage: no_shm_exchange_wrapper.py WORKER [ARGS...]."""
from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from horovodish.common.negotiation import shm_exchange

shm_exchange.ShmExchange.open = classmethod(lambda cls, *args: None)
os.environ["HOROVODISH_TEST_NO_SHM_EXCHANGE"] = "1"  # what the worker may expect
sys.argv = sys.argv[1:]
sys.path[0] = str(Path(sys.argv[0]).resolve().parent)  # as if the worker were run itself
runpy.run_path(sys.argv[0], run_name="__main__")
