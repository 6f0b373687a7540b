"""Stream order for collectives on CUDA memory, with no host wait on the GPU.

1. Submit (the adapter, on the caller's thread): an event is recorded on the
   framework's current stream (``record_ready``). Whatever kernels were enqueued there
   before the call, such as the one still writing the tensor, come before it.
2. Execution (the runtime): the collective's own stream, one per device, waits on the
   group's ready events (``WorkStream.after``), then runs pack, NCCL and unpack. The
   host only enqueues.
3. Completion: an event recorded on the work stream after the last of that
   (``WorkStream.finished``) goes to the handle; ``synchronize()`` makes the caller's
   current stream wait on it (``stream_waits``), so the caller's next kernels see the
   result. The host never blocks on the GPU on this path: no device, stream or event
   synchronize.

CuPy is loaded only by these functions, never at import.
"""
from __future__ import annotations

from typing import Any, Iterable, NamedTuple

from .cuda import load_cupy


class DeviceEvent(NamedTuple):
    """A CuPy event and the device whose streams it orders."""
    event: Any
    device: int


def record_ready(stream_ptr: int, device: int) -> DeviceEvent:
    """An event recorded now on the stream stream_ptr (the framework's current one) of
    device: the collective's stream will wait on it."""
    cuda = load_cupy().cuda
    if cuda.runtime.getDevice() == device:  # the usual case: no context switch
        event = cuda.Event(block=False, disable_timing=True)
    else:
        with cuda.Device(device):
            event = cuda.Event(block=False, disable_timing=True)
    cuda.runtime.eventRecord(event.ptr, stream_ptr)
    return DeviceEvent(event, device)


def stream_waits(stream_ptr: int, event: DeviceEvent) -> None:
    """Make the stream stream_ptr wait on event (enqueued; returns at once)."""
    load_cupy().cuda.runtime.streamWaitEvent(stream_ptr, event.event.ptr, 0)


class WorkStream:
    """The stream a runtime's collectives on one device run on: non-blocking, so it
    neither waits for nor holds up the legacy default stream."""

    def __init__(self, cupy: Any, device: int) -> None:
        self._cupy = cupy
        self.device = device
        with cupy.cuda.Device(device):
            self.stream = cupy.cuda.Stream(non_blocking=True)

    def after(self, events: Iterable[DeviceEvent | None]) -> None:
        """Work enqueued from now on waits for each event (a group's tensors share a
        submit's event: each distinct one is waited on once). The runtime's own calls,
        not CuPy's Stream methods: this runs once per group, and the methods' Python
        wrapping cost more than the call."""
        wait = self._cupy.cuda.runtime.streamWaitEvent
        stream, seen = self.stream.ptr, set()
        for ready in events:
            if ready is not None and id(ready.event) not in seen:
                seen.add(id(ready.event))
                wait(stream, ready.event.ptr, 0)

    def finished(self) -> DeviceEvent:
        """An event that completes once everything enqueued so far has run."""
        cuda = self._cupy.cuda
        event = cuda.Event(block=False, disable_timing=True)
        cuda.runtime.eventRecord(event.ptr, self.stream.ptr)
        return DeviceEvent(event, self.device)
