"""Exception types shared by every adapter.

``HorovodInternalError`` is a ``RuntimeError`` (as in Horovod) so code that catches either
keeps working; elastic training retries on it.
"""


class HorovodInternalError(RuntimeError):
    """A collective failed: a mismatch across ranks, a lost rank, or a shutdown in flight."""


class RankMismatchError(HorovodInternalError):
    """The ranks disagreed on a collective (shape, dtype, op, root rank, splits, scale
    factors, device): every rank's handle fails with it, naming the tensor and what
    differed. A mistake in the script rather than a lost rank, so adapters can tell it
    apart (TensorFlow raises it as FailedPreconditionError, as Horovod does)."""


class NotAMemberError(ValueError):
    """A collective on a registered process set this rank is not in. A ValueError, as
    horovodish raised before; TensorFlow raises it as InvalidArgumentError, as Horovod's
    ops do."""


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by state.commit() on every rank when the elastic launcher has a new set
    of hosts: hvd.elastic.run then ends the process, and the job restarts on them."""


def not_initialized_error() -> ValueError:
    return ValueError(
        "horovodish has not been initialized; call hvd.init() before using any other function."
    )
