"""One rank of ``horovodish.spark.run``, in a process of its own that the Spark task
starts (``python -m horovodish.spark.task RESULT_FILE``): a fresh interpreter, so that
each job forms its own MPI world whatever the executor's Python worker ran before.

The function and its arguments come cloudpickled on stdin; the outcome goes to
RESULT_FILE: ``("ok", value)`` or ``("error", "Type: message", traceback)``.
"""
from __future__ import annotations

import sys
import traceback

import cloudpickle


def main() -> int:
    out_path = sys.argv[1]
    fn, args, kwargs = cloudpickle.loads(sys.stdin.buffer.read())
    try:
        outcome = ("ok", fn(*args, **kwargs))
    except BaseException as exc:  # noqa: BLE001 - reported to the driver, then re-raised
        outcome = ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())
        with open(out_path, "wb") as out:
            cloudpickle.dump(outcome, out)
        raise
    with open(out_path, "wb") as out:
        cloudpickle.dump(outcome, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
