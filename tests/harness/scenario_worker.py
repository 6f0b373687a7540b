"""Scenarios for the harness's own test: one that compares, one that raises, and one
that checks the MPI set-up that tests/mpi_variants.py made."""
from __future__ import annotations

from worker_support import check, close, run_scenario  # noqa: E402


def compares(rank: int, size: int, want: str) -> None:
    close(1.0, float(want), "one")


def raises(rank: int, size: int) -> None:
    raise LookupError("deliberate failure in a scenario")


def variants(rank: int, size: int, version: str) -> None:
    """Run with both variants of tests/mpi_variants.py asked for."""
    from mpi4py import MPI

    from horovodish.common.negotiation.shm_exchange import ShmExchange
    check(".".join(map(str, MPI.Get_version())) == version,
          f"MPI reports version {MPI.Get_version()}, want {version}")
    check(ShmExchange.open(MPI.COMM_WORLD, lambda *args: None) is None,
          "a shared-memory exchange opened")


if __name__ == "__main__":
    run_scenario([compares, raises, variants])
