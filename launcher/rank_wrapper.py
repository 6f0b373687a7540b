"""``python -m horovodish.launcher.rank_wrapper CMD...``: runs one rank of an elastic job
and tells the launcher how it ended.

Why: when a rank is killed (SIGKILL, the OOM killer, a crash), mpirun ends the job and
reports only an exit code; the elastic launcher must know which rank, hence which host,
lost a slot. A killed process cannot say so itself, so each rank runs under this wrapper
(the process mpirun starts), which waits for it and, when it ends non-zero, sends the
rank number and the exit code or signal to the launcher (launcher_link), then ends the
same way, so mpirun sees what it would have seen. When mpirun cleans up after a failure
it kills the wrappers (SIGKILL), which report nothing; their ranks die with them
(PR_SET_PDEATHSIG). Signals the wrapper receives (mpirun forwards Ctrl-C) go to the rank.
The rank inherits every descriptor (Hydra's PMI connection among them) and stdin.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

from horovodish.common.runtime import launcher_link

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
              signal.SIGUSR1, signal.SIGUSR2)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # in the child, between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: mpirun's cleanup has to do
        pass


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m horovodish.launcher.rank_wrapper CMD [ARGS...]",
              file=sys.stderr)
        return 2
    try:
        child = subprocess.Popen(argv, close_fds=False, preexec_fn=_die_with_parent)
    except OSError as exc:
        print(f"horovodishrun: cannot start {argv[0]}: {exc}", file=sys.stderr)
        launcher_link.notify({"kind": "error", "rank": launcher_link.world_rank(),
                              "text": f"cannot start {argv[0]}: {exc}"})
        return 127
    for sig in _FORWARDED:
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:
            continue
    if code != 0:
        report = {"kind": "exit", "rank": launcher_link.world_rank()}
        report.update({"signal": -code} if code < 0 else {"code": code})
        launcher_link.notify(report)
    if code < 0:
        if -code in _FORWARDED:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
