"""One rank of ``horovodish.run`` (launcher/function_job.py):
``python -m horovodish.launcher.function_task FUNCTION_FILE``.

Runs the cloudpickled ``(fn, args, kwargs)`` and sends ``(rank, outcome)`` to the
caller's listener: ``("ok", value)`` or ``("error", "Type: message", traceback)``; then
exits as the function did (an error is raised again, so the job ends as any failed job).
"""
from __future__ import annotations

import os
import sys
import traceback
from multiprocessing.connection import Client
from typing import Any

import cloudpickle

from .function_job import RESULT_ADDRESS_VARIABLE, RESULT_KEY_VARIABLE


def _rank() -> int:
    """This process's rank as its launcher numbered it (init() may not have run, or
    the function may have shut horovodish down)."""
    for name in ("HOROVOD_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "RANK", "PMIX_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def _send(outcome: tuple[Any, ...]) -> None:
    host, port = os.environ[RESULT_ADDRESS_VARIABLE].rsplit(":", 1)
    with Client((host, int(port)),
                authkey=os.environ[RESULT_KEY_VARIABLE].encode()) as connection:
        connection.send_bytes(cloudpickle.dumps((_rank(), outcome)))


def main() -> int:
    with open(sys.argv[1], "rb") as source:
        fn, args, kwargs = cloudpickle.load(source)
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - reported, then raised again
        _send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        raise
    _send(("ok", value))
    return 0


if __name__ == "__main__":
    sys.exit(main())
