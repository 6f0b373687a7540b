"""The integer handles the asynchronous collectives return (as Horovod's do), and
``poll``/``synchronize`` on them: each handle maps to its core handles and to what turns
their results into the caller's return value."""
from __future__ import annotations

import itertools
from typing import Any, Callable

import torch

from ...common.handles import Handle
from ..tensor_views import from_cuda_view, wait_on_current_stream

# Integer handle -> (core handles, what turns their results into the caller's return),
# or, for the single-tensor short path, (the core handle, the tensor to return): one
# tuple per call instead of a tuple, a list and a closure (fewer objects for the
# garbage collector, whose young-generation passes a 256-tensor burst would trigger).
# No lock: under CPython's GIL next() on a count and single dict operations are
# atomic, and each is all that registering or claiming a handle takes (a lock was a
# measurable share of each call).
_handle_ids = itertools.count()
_handles: dict[int, tuple[list[Handle], Callable[[list[Any]], Any]] | tuple[Handle, Any]] = {}


def register(handles: list[Handle] | Handle, finish: Any) -> int:
    """A new integer handle for core handles and what turns their results into the
    caller's return value."""
    handle_id = next(_handle_ids)
    _handles[handle_id] = (handles, finish)
    return handle_id


def then(handle: int, after: Callable[[Any], Any]) -> int:
    """handle, now returning after(what it returned): a grouped call made a single one
    (its one result), or a result copied where the caller wants it."""
    handles, finish = _handles[handle]
    _handles[handle] = (handles, lambda results: after(finish(results)))
    return handle


def _issued() -> int:
    """How many handles were issued so far (without using one up)."""
    return int(repr(_handle_ids)[len("count("):-1])  # e.g. "count(7)"; rare path only


def take(handle: int) -> tuple[list[Handle], Callable[[list[Any]], Any]]:
    """Unregister handle and return its core handles and finish, to build another
    operation from them (sparse allreduce combines two allgathers); a short path's
    single core handle comes back as a list of one, like any other."""
    handles, finish = _handles.pop(handle)
    if type(handles) is list:
        return handles, finish
    return [handles], lambda results, _core=handles: _short_finish(_core, finish, results[0])


def _unknown(handle: int) -> ValueError:
    return ValueError(f"handle {handle} is unknown or was already synchronized")


def poll(handle: int) -> bool:
    """True when the operation behind handle has finished (synchronize will not block)."""
    registered = _handles.get(handle)
    if registered is None:
        raise _unknown(handle)
    handles = registered[0]
    return all(h.done() for h in handles) if type(handles) is list else handles.done()


def synchronize(handle: int) -> Any:
    """Wait for handle; returns the output tensor(s) or raises HorovodInternalError.
    The handle stays known (to poll from another thread) until the wait is over; a
    handle synchronized already gives None, as in Horovod (one never issued raises)."""
    registered = _handles.get(handle)
    if registered is None:
        if isinstance(handle, int) and 0 <= handle < _issued():
            return None
        raise _unknown(handle)
    handles, finish = registered
    try:
        if type(handles) is not list:  # a short path's (core handle, tensor or OWNED)
            return _short_finish(handles, finish, handles.wait())
        results = [h.wait() for h in handles]
        # CUDA views (the NCCL path): entries carry completion events; other handles
        # (plain Handle objects, in tests) have none.
        if handles and getattr(handles[0], "event", None) is not None:
            _stream_waits_for(handles)
        return finish(results)
    finally:
        _handles.pop(handle, None)


def _short_finish(handle: Handle, finish: Any, result: Any) -> Any:
    """What a short path's handle returns: the runtime's result as a tensor (OWNED),
    a CUDA result once the caller's stream waits for it, or the caller's own tensor."""
    if finish is OWNED:
        return torch.from_numpy(result)
    if type(finish) is OnDevice:
        return finish.complete(handle, result)
    return finish


# The short paths' finish for an out-of-place result: the result is the runtime's
# (a view of a result block, reused once the caller drops it), made a tensor at synchronize.
OWNED = object()


class OnDevice:
    """The finish of one CUDA tensor's short path (allreduce.py): the caller's current
    stream waits for the result, which is the tensor itself (in place) or a view of the
    runtime's block. Holding the tensor keeps its memory from the caching allocator
    until then: the collective's stream may still be reading it."""
    __slots__ = ("tensor", "in_place")

    def __init__(self, tensor: torch.Tensor, in_place: bool) -> None:
        self.tensor = tensor
        self.in_place = in_place

    def complete(self, handle: Handle, result: Any) -> torch.Tensor:
        wait_on_current_stream(handle.event)
        if self.in_place:
            return self.tensor
        return from_cuda_view(result, self.tensor.dtype)


def _stream_waits_for(handles: list[Handle]) -> None:
    """The caller's current stream waits for the results on the device (each group's
    completion event once): the host does not wait for the GPU."""
    seen: set[int] = set()
    for h in handles:
        event = getattr(h, "event", None)
        if event is not None and id(event.event) not in seen:
            seen.add(id(event.event))
            wait_on_current_stream(event)
