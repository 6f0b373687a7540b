"""The core's collectives, topology and backend choice on emulated hosts (and, for
comparison, on one host), against numpy on every rank (workers/core_worker.py)."""
from __future__ import annotations

import socket

from multirank import assert_ranks_ok, run_ranks

from .jobs import WORKERS, run_job

CHECKS = ["check_topology", "check_backend_choice", "check_allreduce",
          "check_grouped_and_scaled", "check_other_collectives", "check_join",
          "check_process_sets"]


def test_two_hosts_of_two_ranks(cluster):
    """Homogeneous: large allreduces go hierarchical, small ones flat; allgathers go
    hierarchical when Horovod's variable asks."""
    result = run_job(cluster, "core_worker.py", "h1:2,h2:2", args=["h1:2,h2:2"],
                     env={"HOROVOD_HIERARCHICAL_ALLGATHER": "1"})
    assert_ranks_ok(result, 4, CHECKS)


def test_uneven_hosts_fall_back_to_the_flat_allreduce(cluster):
    """2+1+1 ranks: asked for by Horovod's variable, the hierarchical allreduce says why
    it cannot run, and the flat one gives the same results."""
    hosts = "h1:2,h2:1,h3:1"
    result = run_job(cluster, "core_worker.py", hosts, args=[hosts],
                     env={"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"})
    assert_ranks_ok(result, 4, CHECKS)
    assert result.stdout.count("hierarchical allreduce unavailable (hosts run different "
                               "numbers of ranks ([1, 2])") == 1, result.stdout


def test_one_host():
    """The same worker on one host of 2 ranks: shared memory, never hierarchical, even
    when asked for."""
    layout = f"{socket.gethostname()}:2"
    result = run_ranks(WORKERS / "core_worker.py", 2, args=[layout], timeout=120,
                       env={"HOROVODISH_HIERARCHICAL_ALLREDUCE": "1"})
    assert_ranks_ok(result, 2, CHECKS)
