"""NCCL through CuPy: collectives on CUDA memory, enqueued on a stream of our own.

Every request whose views are device memory (device ``cuda``, see execution/cuda.py)
comes here; host backends never see them. The backend:

- creates CuPy's ``NcclCommunicator`` for the process set lazily, at the first CUDA
  collective (``Communicators``): every rank learns whether every other rank can load
  NCCL, rank 0's unique id travels over MPI, and a failure on any rank (NCCL refuses
  two ranks on one GPU, say) fails the collective on every rank, and every later one;
- runs each collective on its ``WorkStream`` after the group's ready events, and
  hands each entry the event that marks its result (cuda_streams.py);
- fuses a group by one pack launch into a device fusion buffer, one NCCL call, one
  unpack launch (gpu_fusion.py), with prescale, postscale and Average folded into the
  copies; callers that let the runtime own the result (DistributedOptimizer) get views
  of a device result block, with no unpack at all;
- allgather with uneven first dimensions: grouped broadcasts (one per rank); alltoall:
  grouped send/recv; reducescatter with uneven parts: padded to the largest part.

Nothing here blocks the host on the GPU. It needs one GPU per rank: NCCL refuses two
ranks on one device ("Duplicate GPU detected").
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any, Callable

import numpy as np

from ...messages import ReduceOp, RequestType, Response
from ...entry import Entry
from ..cuda import load_cupy, load_nccl, why_not
from ..cuda_streams import WorkStream
from ..buffers import FusionBuffers, ResultBlocks
from ..gpu_fusion import (BatchedCopier, pack_pointers, plan_layout, storage_dtype,
                          unpack_pointers)
from ..fused_group import AllreduceGroup
from .base import Backend

# NCCL's enum values (nccl.h), as CuPy's nccl module also names them.
NCCL_TYPES = {"int8": 0, "uint8": 1, "bool": 1, "int32": 2, "int64": 4, "float16": 6,
              "float32": 7, "float64": 8, "bfloat16": 9}
NCCL_BYTES = 1  # ncclUint8: what non-reducing collectives move
_NCCL_SUM, _NCCL_PROD, _NCCL_MAX, _NCCL_MIN = 0, 1, 2, 3
_NCCL_OPS = {ReduceOp.SUM: _NCCL_SUM, ReduceOp.PRODUCT: _NCCL_PROD, ReduceOp.MAX: _NCCL_MAX,
             ReduceOp.MIN: _NCCL_MIN}
# bool travels as uint8 0/1: logical or is max, logical and is min.
_NCCL_BOOL_OPS = {ReduceOp.SUM: _NCCL_MAX, ReduceOp.MAX: _NCCL_MAX,
                  ReduceOp.PRODUCT: _NCCL_MIN, ReduceOp.MIN: _NCCL_MIN}


def nccl_reduction(dtype: str, op: ReduceOp) -> tuple[int, int]:
    """(NCCL datatype, NCCL op) for a reduction of dtype; ValueError where NCCL has
    none (placement stages those through the host, so this is a bug if it fires)."""
    if dtype not in NCCL_TYPES or op not in _NCCL_OPS:
        raise ValueError(f"NCCL cannot reduce {dtype} with {op.name}")
    return NCCL_TYPES[dtype], (_NCCL_BOOL_OPS if dtype == "bool" else _NCCL_OPS)[op]


def _displacements(counts: list[int]) -> list[int]:
    return np.concatenate(([0], np.cumsum(counts[:-1], dtype=np.int64))).tolist() \
        if counts else []


class Communicators:
    """The process set's NCCL communicator on each device this rank uses, created by
    the first collective that needs it (collective: every rank reaches it in the same
    response). comm is the set's MPI communicator."""

    def __init__(self, comm: Any, nccl: Callable[[], Any] = load_nccl,
                 device_context: Callable[[int], Any] | None = None) -> None:
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._nccl = nccl
        self._device_context = device_context or (lambda device: load_cupy().cuda.Device(device))
        self._communicators: dict[int, Any] = {}
        self._failure: str | None = None

    def get(self, device: int) -> Any:
        if self._failure is not None:
            raise RuntimeError(self._failure)
        communicator = self._communicators.get(device)
        if communicator is None:
            communicator = self._create(device)
            self._communicators[device] = communicator
        return communicator

    def _create(self, device: int) -> Any:
        # Round 1: does NCCL load everywhere? (rank 0's unique id rides along.) A rank
        # that cannot load it must not leave the others inside ncclCommInitRank.
        problem = why_not(self._nccl)
        unique_id = None
        if problem is None and self.rank == 0:
            try:
                unique_id = self._nccl().get_unique_id()
            except Exception as exc:
                problem = f"ncclGetUniqueId failed: {exc}"
        everyone = self.comm.allgather((problem, unique_id))
        self._fail_if(everyone, "cannot load NCCL")
        unique_id = everyone[0][1]
        # Round 2: create it (NCCL's own collective), then agree on the outcome.
        communicator, problem = None, None
        try:
            with self._device_context(device):
                communicator = self._nccl().NcclCommunicator(self.size, unique_id, self.rank)
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
        everyone = self.comm.allgather((problem, None))
        if any(p for p, _ in everyone) and communicator is not None:
            communicator.destroy()
        self._fail_if(everyone, f"could not create the NCCL communicator (device {device} "
                                f"on this rank)")
        return communicator

    def _fail_if(self, everyone: list[tuple[str | None, Any]], what: str) -> None:
        failed = {rank: problem for rank, (problem, _) in enumerate(everyone) if problem}
        if failed:
            details = "; ".join(f"rank {rank}: {problem}" for rank, problem in failed.items())
            self._failure = (f"NCCL: {what} ({details}). Every CUDA collective on this "
                             "process set fails from now on; HOROVODISH_GPU_OPERATIONS=mpi "
                             "stages CUDA tensors through host memory instead (and NCCL "
                             "needs one GPU per rank).")
            raise RuntimeError(self._failure)

    def close(self) -> None:
        for communicator in self._communicators.values():
            communicator.destroy()
        self._communicators.clear()

    def abort(self, reason: str) -> None:
        """ncclCommAbort on every communicator (local, callable from any thread): after
        a failure (a peer lost or stalled mid-job), the NCCL operations this rank has
        queued, and the framework streams that wait on them, would otherwise wait for
        that peer for good. Every later CUDA collective on this set raises."""
        self._failure = f"NCCL: the communicators were aborted{reason}"
        for communicator in list(self._communicators.values()):
            try:
                communicator.abort()
            except Exception:  # noqa: BLE001 (aborting the others matters more)
                pass
        self._communicators.clear()


@dataclass
class _Device:
    """What the backend keeps per device: stream, copy kernels, buffers."""
    stream: WorkStream
    copier: BatchedCopier
    buffers: FusionBuffers
    blocks: ResultBlocks


class NcclBackend(Backend):
    name = "nccl"
    memory = "cuda"
    pipelined = False  # the GPU gains nothing from cache-sized pieces

    def __init__(self, comm: Any, communicators: Communicators | None = None) -> None:
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.communicators = communicators or Communicators(comm)
        self._devices: dict[int, _Device] = {}
        self._last_device: int | None = None

    def enabled(self, kind: RequestType, dtype: str, nbytes: int, tensors: int = 1,
                op: ReduceOp | None = None) -> bool:
        return True  # placement sent only what NCCL can run (execution/cuda.py)

    # -- per device ------------------------------------------------------------------
    def _device(self, views: list[Any]) -> tuple[int, _Device]:
        """The device of the group's views (all on one), and its state. A rank that
        has joined (no views) uses the device it used before."""
        devices = {view.device.id for view in views if view is not None}
        if len(devices) > 1:
            raise ValueError(f"tensors of one collective are on devices {sorted(devices)}: "
                             "horovodish runs one GPU per rank (move them to one device)")
        if devices:
            device = devices.pop()
        elif self._last_device is not None:
            device = self._last_device
        else:
            device = load_cupy().cuda.runtime.getDevice()
        self._last_device = device
        state = self._devices.get(device)
        if state is None:
            cupy = load_cupy()
            stream = WorkStream(cupy, device)

            def empty(count: int, dtype: np.dtype) -> Any:
                with cupy.cuda.Device(device), stream.stream:
                    # Allocated on the work stream: CuPy's pool then reuses freed
                    # memory in that stream's order, after the work that used it.
                    return cupy.empty(count, dtype=dtype)
            state = _Device(stream, BatchedCopier(cupy), FusionBuffers(empty),
                            ResultBlocks(empty=empty))
            self._devices[device] = state
        return device, state

    # -- allreduce -------------------------------------------------------------------
    def allreduce_group(self, group: AllreduceGroup) -> list:
        entries = group.entries
        device, state = self._device([e.tensor if e is not None else None for e in entries])
        cupy = load_cupy()
        if cupy.cuda.runtime.getDevice() == device:  # the usual case: no context switch
            return self._enqueue_allreduce(group, device, state)
        with cupy.cuda.Device(device):
            return self._enqueue_allreduce(group, device, state)

    def _enqueue_allreduce(self, group: AllreduceGroup, device: int, state: _Device) -> list:
        entries = group.entries
        communicator = self.communicators.get(device)
        stream = state.stream
        stream.after(e.event for e in entries if e is not None)
        group.workspace.phase("NCCL_ALLREDUCE")
        results = self._allreduce(group, group.responses[0].dtype, state, communicator)
        done = stream.finished()
        for entry in entries:
            if entry is not None:
                entry.event = done
        return results

    def _allreduce(self, group: AllreduceGroup, dtype: str, state: _Device,
                   communicator: Any) -> list:
        entries, counts = group.entries, group.counts
        datatype, op = nccl_reduction(dtype, group.op)
        storage = storage_dtype(dtype)
        stream, copier = state.stream.stream, state.copier
        if len(entries) == 1 and entries[0] is not None and group.prescale == 1.0:
            return [self._allreduce_one(group, entries[0], datatype, op, state, communicator)]
        total = sum(counts)
        owned = any(e is not None and e.output is None for e in entries)
        if len(entries) == 1 and not owned and entries[0] is not None:
            entry = entries[0]  # one tensor, prescaled: into its output, no fusion buffer
            layout = plan_layout((total,))
            out = entry.output.data.ptr
            send = entry.tensor.data.ptr
            if group.prescale != 1.0:
                copier.launch(dtype, layout, [send], [out], stream, scale=group.prescale)
                send = out
            if total:
                communicator.allReduce(send, out, total, datatype, op, stream.ptr)
            if group.postscale != 1.0 or group.divide_by:
                copier.launch(dtype, layout, [out], [out], stream, scale=group.postscale,
                              divisor=group.divide_by)
            return [entry.output]
        layout = plan_layout(tuple(counts))
        buf = state.blocks.take(storage, total) if owned else state.buffers.get(storage, total)
        base = buf.data.ptr if total else 0
        inputs = [e.tensor.data.ptr if e is not None else 0 for e in entries]
        copier.launch(dtype, layout, *pack_pointers(layout, base, storage.itemsize, inputs),
                      stream, scale=group.prescale)
        if total:
            communicator.allReduce(base, base, total, datatype, op, stream.ptr)
        outputs = [e.output.data.ptr if e is not None and e.output is not None else 0
                   for e in entries]
        if not owned:
            copier.launch(dtype, layout, *unpack_pointers(layout, base, storage.itemsize,
                                                           outputs),
                          stream, scale=group.postscale, divisor=group.divide_by)
            return [e.output if e is not None else None for e in entries]
        if group.postscale != 1.0 or group.divide_by:  # in place: the block is the result
            whole = plan_layout((total,))
            copier.launch(dtype, whole, [base], [base], stream, scale=group.postscale,
                          divisor=group.divide_by)
        if any(outputs):  # callers that gave an output (mixed in one group) get copies
            copier.launch(dtype, layout, *unpack_pointers(layout, base, storage.itemsize,
                                                           outputs), stream)
        results, offset = [], 0
        for entry, response in zip(entries, group.responses):
            if entry is None:
                results.append(None)
            elif entry.output is not None:
                results.append(entry.output)
            else:
                results.append(buf[offset:offset + response.count].reshape(response.shape))
            offset += response.count
        return results

    def _allreduce_one(self, group: AllreduceGroup, entry: Entry, datatype: int, op: int,
                       state: _Device, communicator: Any) -> Any:
        """One tensor without a prescale (most calls, and every large one: fusion.py
        leaves those alone): NCCL reads the input where it is and writes the caller's
        output, or a result block the caller gets as its result; no pack, no unpack,
        and only the postscale's launch if there is one."""
        response = group.responses[0]
        count, stream = response.count, state.stream.stream
        if entry.output is None:
            result = state.blocks.take(storage_dtype(response.dtype), count)
            out = result.data.ptr if count else 0
        else:
            result = entry.output
            out = result.data.ptr
        if count:
            communicator.allReduce(entry.tensor.data.ptr, out, count, datatype, op, stream.ptr)
            if group.postscale != 1.0 or group.divide_by:
                state.copier.launch(response.dtype, plan_layout((count,)), [out], [out],
                                    stream, scale=group.postscale, divisor=group.divide_by)
        if entry.output is None and result.shape != response.shape:
            return result.reshape(response.shape)
        return result

    # -- the rest: one response each -------------------------------------------------
    def run_one(self, kind: RequestType, response: Response, entry: Entry | None,
                scaling: tuple[float, float, int]) -> Any:
        if entry is None:  # only allreduce continues after a join (the coordinator)
            raise RuntimeError(f"{kind.opname} of '{response.name}' has no tensor here")
        device, state = self._device([entry.tensor])
        cupy = load_cupy()
        with cupy.cuda.Device(device):
            communicator = self.communicators.get(device)
            state.stream.after([entry.event])
            stream = state.stream.stream
            if kind == RequestType.ALLGATHER:
                result = self._allgather(response, entry, communicator, stream)
            elif kind == RequestType.BROADCAST:
                result = self._broadcast(response, entry, communicator, stream)
            elif kind == RequestType.ALLTOALL:
                result = self._alltoall(response, entry, communicator, stream)
            else:
                result = self._reducescatter(response, entry, communicator, state, scaling)
            entry.event = state.stream.finished()
        return result

    def _allgather(self, response: Response, entry: Entry, communicator: Any,
                   stream: Any) -> Any:
        first_dims = response.first_dims
        assert first_dims is not None
        row_shape = tuple(response.shape[1:])
        out = entry.allocate((sum(first_dims),) + row_shape)
        row_bytes = prod(row_shape) * out.itemsize
        sizes = [d * row_bytes for d in first_dims]
        send, recv = entry.tensor.data.ptr, out.data.ptr
        if len(set(sizes)) == 1:
            if sizes[0]:
                communicator.allGather(send, recv, sizes[0], NCCL_BYTES, stream.ptr)
            return out
        # Uneven: each rank broadcasts its part into place, all in one NCCL group.
        nccl = load_nccl()
        nccl.groupStart()
        try:
            for root, (size, displ) in enumerate(zip(sizes, _displacements(sizes))):
                if size:
                    source = send if root == self.rank else recv + displ
                    communicator.broadcast(source, recv + displ, size, NCCL_BYTES, root,
                                           stream.ptr)
        finally:
            nccl.groupEnd()
        return out

    def _broadcast(self, response: Response, entry: Entry, communicator: Any,
                   stream: Any) -> Any:
        out = entry.output
        if out.nbytes:  # the root copies its input into its output on the way
            send = entry.tensor.data.ptr if self.rank == response.root_rank else out.data.ptr
            communicator.broadcast(send, out.data.ptr, out.nbytes, NCCL_BYTES,
                                   response.root_rank, stream.ptr)
        return out

    def _alltoall(self, response: Response, entry: Entry, communicator: Any,
                  stream: Any) -> tuple[Any, np.ndarray]:
        splits = response.splits
        assert splits is not None
        row_shape = tuple(entry.tensor.shape[1:])
        received = [splits[source][self.rank] for source in range(self.size)]
        out = entry.allocate((sum(received),) + row_shape)
        row_bytes = prod(row_shape) * out.itemsize
        send_sizes = [s * row_bytes for s in splits[self.rank]]
        recv_sizes = [r * row_bytes for r in received]
        send, recv = entry.tensor.data.ptr, out.data.ptr
        nccl = load_nccl()
        nccl.groupStart()
        try:
            for peer, (size, displ) in enumerate(zip(send_sizes, _displacements(send_sizes))):
                if size:
                    communicator.send(send + displ, size, NCCL_BYTES, peer, stream.ptr)
            for peer, (size, displ) in enumerate(zip(recv_sizes, _displacements(recv_sizes))):
                if size:
                    communicator.recv(recv + displ, size, NCCL_BYTES, peer, stream.ptr)
        finally:
            nccl.groupEnd()
        return out, np.asarray(received, dtype=np.int32)

    def _reducescatter(self, response: Response, entry: Entry, communicator: Any,
                       state: _Device, scaling: tuple[float, float, int]) -> Any:
        """NCCL's reduce-scatter gives every rank the same count: parts are padded to
        the largest (the first rows % size ranks have one row more), packed with the
        prescale by one launch, and this rank's part copied out with the postscale."""
        prescale, postscale, divisor = scaling
        dtype = response.dtype
        datatype, op = nccl_reduction(dtype, ReduceOp.SUM if response.reduce_op ==
                                      ReduceOp.AVERAGE else response.reduce_op)
        rows = response.shape[0] if response.shape else 0
        row = prod(response.shape[1:])
        base_rows, extra = divmod(rows, self.size)
        counts = [(base_rows + (1 if r < extra else 0)) * row for r in range(self.size)]
        widest = max(counts)
        out = entry.output
        if not widest:
            return out
        storage = storage_dtype(dtype)
        itemsize = storage.itemsize
        stream, copier = state.stream.stream, state.copier
        scratch = state.buffers.get(storage, widest * (self.size + 1))
        send, recv = scratch.data.ptr, scratch.data.ptr + widest * self.size * itemsize
        layout = plan_layout(tuple(counts))
        source = entry.tensor.data.ptr
        copier.launch(dtype, layout,
                      [source + d * itemsize for d in _displacements(counts)],
                      [send + r * widest * itemsize for r in range(self.size)],
                      stream, scale=prescale)
        communicator.reduceScatter(send, recv, widest, datatype, op, stream.ptr)
        mine = counts[self.rank]
        if mine:
            copier.launch(dtype, plan_layout((mine,)), [recv], [out.data.ptr], stream,
                          scale=postscale, divisor=divisor)
        return out

    def close(self) -> None:
        """Destroy the communicators (every rank's runtime closes in the same cycle)."""
        self.communicators.close()
        self._devices.clear()

    def abort(self, reason: str) -> None:
        """After a failure, alone: see Communicators.abort."""
        self.communicators.abort(reason)
