"""The NCCL backend on CPU, through a fake CuPy and NCCL (tests/common/fake_cuda.py):
the lazy communicator's life cycle and failures, and every collective's enqueued work
(pack and unpack kernels, NCCL calls, pointers, scaling) run on host memory by ranks
that are threads of this process. Stream order is not tested here (the fake runs
everything at once); tests/gpu does that on a GPU."""
from __future__ import annotations

import shutil
import sys
import threading
from typing import Any, Callable

import ml_dtypes
import numpy as np
import pytest

from horovodish.common.execution.arithmetic import divide_toward_zero, scale_into
from horovodish.common.execution.backends.nccl import Communicators, NcclBackend
from horovodish.common.execution.executor import Executor
from horovodish.common.execution.operations import OperationManager
from horovodish.common.messages import ReduceOp, Request, RequestType, Response
from horovodish.common.entry import Entry
from horovodish.common.handles import Completions

from .fake_cuda import Exchange, FakeArray, FakeCupy, FakeNccl

pytestmark = pytest.mark.skipif(shutil.which("g++") is None,
                                reason="the fake GPU runs the real kernel through g++")


class FakeMPI:
    """The set's MPI communicator, as far as the backend uses it (allgather)."""

    def __init__(self, exchange: Exchange, rank: int) -> None:
        self.exchange, self.rank = exchange, rank

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.exchange.size

    def allgather(self, value: Any) -> list[Any]:
        return self.exchange.everyone(self.rank, value)


class World:
    def __init__(self, size: int, folder, monkeypatch) -> None:
        self.size = size
        self.nccl = FakeNccl(Exchange(size))
        self.cupy = FakeCupy(self.nccl, folder)
        self.mpi = Exchange(size)
        monkeypatch.setitem(sys.modules, "cupy", self.cupy)
        monkeypatch.setitem(sys.modules, "cupy.cuda", self.cupy.cuda)
        monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", self.nccl)

    def comm(self, rank: int) -> FakeMPI:
        return FakeMPI(self.mpi, rank)

    def run(self, fn: Callable[[int], Any]) -> list[Any]:
        """fn(rank) on every rank at once; its results (or the exception it raised)."""
        results: list[Any] = [None] * self.size

        def main(rank: int) -> None:
            try:
                results[rank] = fn(rank)
            except BaseException as exc:  # noqa: BLE001 (the test looks at it)
                results[rank] = exc
        threads = [threading.Thread(target=main, args=(r,)) for r in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        return results


@pytest.fixture(scope="module")
def kernel_folder(tmp_path_factory):
    return tmp_path_factory.mktemp("fake-gpu-kernels")


@pytest.fixture
def world(kernel_folder, monkeypatch, request):
    return lambda size: World(size, kernel_folder, monkeypatch)


# -- the communicator's life cycle -----------------------------------------------------------
def test_communicator_is_created_on_first_use_once_from_rank_0s_id(world):
    w = world(2)
    communicators = [Communicators(w.comm(r), device_context=_no_context) for r in range(2)]
    assert w.nccl.created == []  # nothing at construction
    first = w.run(lambda r: communicators[r].get(0))
    assert len(w.nccl.created) == 2 and len({uid for _, uid in w.nccl.created}) == 1
    again = [communicators[r].get(0) for r in range(2)]  # no collective: one rank alone
    assert again == first and len(w.nccl.created) == 2
    for c in communicators:
        c.close()
    assert all(c.destroyed for c in first)


def test_nccl_missing_on_one_rank_fails_every_rank_and_every_later_call(world):
    w = world(2)

    def loader(rank):
        def load():
            if rank == 1:
                raise ImportError("libnccl.so.2: cannot open shared object file")
            return w.nccl
        return load
    communicators = [Communicators(w.comm(r), nccl=loader(r), device_context=_no_context)
                     for r in range(2)]
    errors = w.run(lambda r: communicators[r].get(0))
    for error in errors:
        assert isinstance(error, RuntimeError)
        assert "cannot load NCCL" in str(error) and "rank 1: ImportError" in str(error)
        assert "HOROVODISH_GPU_OPERATIONS=mpi" in str(error)
    assert w.nccl.created == []  # nobody entered ncclCommInitRank
    with pytest.raises(RuntimeError, match="rank 1"):  # later: at once, no collective
        communicators[0].get(0)


def test_a_failed_creation_on_one_rank_fails_every_rank(world):
    w = world(2)
    w.nccl.init_failures[1] = "ncclInvalidUsage: Duplicate GPU detected"
    communicators = [Communicators(w.comm(r), device_context=_no_context) for r in range(2)]
    errors = w.run(lambda r: communicators[r].get(0))
    for error in errors:
        assert isinstance(error, RuntimeError) and "Duplicate GPU detected" in str(error)
        assert "could not create the NCCL communicator" in str(error)


def _no_context(device: int):
    import contextlib
    return contextlib.nullcontext()


# -- collectives through the executor ------------------------------------------------------
def _executor(w: World, rank: int) -> Executor:
    return Executor(OperationManager([NcclBackend(w.comm(rank))]), rank, w.size)


def _entry(response: Response, tensor, output=None, allocate=None) -> Entry:
    request = Request(response.name, response.type, response.dtype, response.shape,
                      device="cuda")
    return Entry(request, tensor, Completions(), output, allocate)


def _view(array: np.ndarray) -> FakeArray:
    if array.dtype == ml_dtypes.bfloat16:  # as the torch adapter passes it: its bits
        return FakeArray(array.view(np.int16))
    return FakeArray(array)


def _host(view: FakeArray, dtype: np.dtype) -> np.ndarray:
    return view.host.view(dtype) if view.host.dtype != dtype else view.host


def _data(dtype: str, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, count).astype(np.bool_)
    if dtype in ("int32", "int64", "uint8", "int8"):
        return rng.integers(0, 50, count).astype(dtype)
    numpy_type = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    return rng.uniform(-4, 4, count).astype(numpy_type)


ALLREDUCES = [  # dtype, op, prescale, postscale
    ("float32", ReduceOp.AVERAGE, 1.0, 1.0),
    ("float32", ReduceOp.SUM, 0.5, 3.0),
    ("float64", ReduceOp.MAX, 1.0, 1.0),
    ("float16", ReduceOp.AVERAGE, 1.0, 2.0),
    ("bfloat16", ReduceOp.SUM, 2.0, 1.0),
    ("int32", ReduceOp.AVERAGE, 1.0, 1.0),
    ("int64", ReduceOp.PRODUCT, 1.0, 1.0),
    ("uint8", ReduceOp.MIN, 1.0, 1.0),
    ("bool", ReduceOp.SUM, 1.0, 1.0),
]


def _reference(dtype: str, op: ReduceOp, pre: float, post: float,
               inputs: list[np.ndarray | None], size: int) -> np.ndarray:
    """Horovod's arithmetic on the host: what every path must give."""
    numpy_type = inputs[0].dtype
    scaled = []
    for x in inputs:
        x = np.zeros_like(inputs[0]) if x is None else x
        out = np.empty_like(x)
        factor = pre / size if op == ReduceOp.AVERAGE and dtype in ("float32", "float64") \
            else pre
        scale_into(out, x, factor) if dtype != "bool" else np.copyto(out, x)
        scaled.append(out)
    ufunc = {ReduceOp.AVERAGE: np.add, ReduceOp.SUM: np.add, ReduceOp.MAX: np.maximum,
             ReduceOp.MIN: np.minimum, ReduceOp.PRODUCT: np.multiply}[op]
    if dtype == "bool":
        ufunc = np.logical_or if op in (ReduceOp.SUM, ReduceOp.MAX) else np.logical_and
    total = np.array(ufunc.reduce(np.stack(scaled), axis=0), dtype=numpy_type)
    if op == ReduceOp.AVERAGE and dtype in ("float16", "bfloat16"):
        post = post / size
    if op == ReduceOp.AVERAGE and dtype.startswith(("int", "uint")):
        divide_toward_zero(total, size)
    elif post != 1.0:
        scale_into(total, total, post)
    return total


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    if got.dtype.kind in "f" or got.dtype == ml_dtypes.bfloat16:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=1e-2, atol=1e-2, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


@pytest.mark.parametrize("size", [1, 2, 3])
@pytest.mark.parametrize("dtype,op,pre,post", ALLREDUCES,
                         ids=[f"{d}-{o.name}" for d, o, _, _ in ALLREDUCES])
def test_fused_single_and_owned_allreduce(world, size, dtype, op, pre, post):
    w = world(size)
    counts = [5, 0, 4097, 3, 1]  # ragged: one past a chunk, an empty one
    shapes = [(5,), (0,), (17, 241), (3, 1), ()]
    responses = [Response(f"t{i}", RequestType.ALLREDUCE, dtype, shape, op, prescale=pre,
                          postscale=post, device="cuda") for i, shape in enumerate(shapes)]
    inputs = {(r, i): _data(dtype, c, 10 * r + i).reshape(shapes[i])
              for r in range(size) for i, c in enumerate(counts)}
    joined = size - 1 if size > 1 else None  # the last rank has joined: zeros

    def rank_main(rank: int):
        executor = _executor(w, rank)
        results = {}
        for mode in ("outputs", "owned", "single", "owned single"):
            group = responses if "single" not in mode else responses[2:3]
            mine = []
            for response in group:
                i = responses.index(response)
                if rank == joined and mode == "outputs":
                    mine.append(None)
                    continue
                x = inputs[(rank, i)]
                output = None if mode.startswith("owned") else _view(np.empty_like(x))
                mine.append(_entry(response, _view(x.copy()), output))
            executor.execute(group, mine)
            results[mode] = [None if e is None else e.wait() for e in mine]
            assert all(e is None or e.event is not None for e in mine)  # completion event
        return results

    outcome = w.run(rank_main)
    for rank, results in enumerate(outcome):
        assert not isinstance(results, BaseException), results
        for mode, got in results.items():
            indices = range(len(shapes)) if "single" not in mode else [2]
            for index, value in zip(indices, got):
                if value is None:
                    continue
                contributions = [None if (mode == "outputs" and r == joined)
                                 else inputs[(r, index)] for r in range(size)]
                want = _reference(dtype, op, pre, post, contributions, size)
                got_host = _host(value, want.dtype).reshape(want.shape)
                _close(got_host, want, f"rank {rank} {mode} tensor {index}")


def test_a_fused_group_is_one_launch_each_way_and_one_nccl_call(world):
    w = world(1)
    responses = [Response(f"g{i}", RequestType.ALLREDUCE, "float32", (7 * i + 1,),
                          ReduceOp.SUM, postscale=2.0, device="cuda") for i in range(40)]
    backend = NcclBackend(w.comm(0))
    executor = Executor(OperationManager([backend]), 0, 1)
    mine = [_entry(r, _view(np.ones(r.shape, np.float32)), _view(np.empty(r.shape,
            np.float32))) for r in responses]
    executor.execute(responses, mine)
    for e in mine:
        e.wait()
    (communicator,) = backend.communicators._communicators.values()
    assert communicator.calls == ["allReduce"]
    assert w.cupy.launches == ["horovodish_copy_float32"]  # compiled once, for the dtype
    assert w.cupy.calls == ["horovodish_copy_float32"] * 2  # pack, unpack: 40 tensors
    assert _host(mine[3].wait(), np.float32).tolist() == [2.0] * 22


def test_one_tensor_into_a_result_block_is_one_nccl_call_and_no_launch(world):
    """An out-of-place single allreduce without a prescale: NCCL reads the input where
    it is and writes the block (a pack launch costs host time on every call)."""
    w = world(1)
    response = Response("one", RequestType.ALLREDUCE, "float32", (4099,), ReduceOp.SUM,
                        device="cuda")
    backend = NcclBackend(w.comm(0))
    executor = Executor(OperationManager([backend]), 0, 1)
    x = np.arange(4099, dtype=np.float32)
    entry = _entry(response, _view(x))
    executor.execute([response], [entry])
    got = _host(entry.wait(), np.float32)
    (communicator,) = backend.communicators._communicators.values()
    assert communicator.calls == ["allReduce"] and w.cupy.calls == []
    np.testing.assert_array_equal(got, x)


def test_the_work_stream_waits_on_each_ready_event_once_and_records_completion(world):
    """A fused group whose entries carry two submits' ready events: the work stream
    waits on each once, before the group's work, and the completion event every entry
    gets is recorded on the work stream."""
    from horovodish.common.execution.cuda_streams import DeviceEvent
    w = world(1)
    responses = [Response(f"s{i}", RequestType.ALLREDUCE, "float32", (5,), ReduceOp.SUM,
                          device="cuda") for i in range(3)]
    backend = NcclBackend(w.comm(0))
    executor = Executor(OperationManager([backend]), 0, 1)
    first, second = (DeviceEvent(w.cupy.cuda.Event(), 0) for _ in range(2))
    mine = [_entry(r, _view(np.ones(5, np.float32)), _view(np.empty(5, np.float32)))
            for r in responses]
    for entry, ready in zip(mine, (first, second, first)):
        entry.event = ready
    executor.execute(responses, mine)
    for e in mine:
        e.wait()
    (state,) = backend._devices.values()
    work = state.stream.stream.ptr
    assert w.cupy.waits == [(work, first.event.ptr), (work, second.event.ptr)]
    done = {id(e.event) for e in mine}
    assert len(done) == 1 and mine[0].event not in (first, second)
    assert w.cupy.records == [(mine[0].event.event.ptr, work)]


@pytest.mark.parametrize("size", [1, 2, 3])
def test_allgather_broadcast_alltoall_reducescatter(world, size):
    w = world(size)

    def rank_main(rank: int):
        executor = _executor(w, rank)
        out = {}
        # allgather, uneven first dimensions (grouped broadcasts) and even (allGather)
        for tag, dims in (("uneven", [r + 1 for r in range(size)]), ("even", [2] * size)):
            x = np.full((dims[rank], 3), rank + 1, dtype=np.int32)
            response = Response(f"ag.{tag}", RequestType.ALLGATHER, "int32", x.shape,
                                device="cuda", first_dims=tuple(dims))
            kept: list = []
            entry = _entry(response, _view(x), allocate=lambda shape, k=kept: k.append(
                _view(np.empty(shape, np.int32))) or k[-1])
            executor.execute([response], [entry])
            out[f"allgather.{tag}"] = entry.wait().host.copy()
        # broadcast from the last rank, not in place
        x = np.arange(6, dtype=np.float64) + 10 * rank
        response = Response("bc", RequestType.BROADCAST, "float64", x.shape,
                            root_rank=size - 1, device="cuda")
        entry = _entry(response, _view(x), _view(np.zeros_like(x)))
        executor.execute([response], [entry])
        out["broadcast"] = entry.wait().host.copy()
        # alltoall with uneven splits: rank r sends (r + p) % 3 rows to peer p
        splits = tuple(tuple((s + p) % 3 for p in range(size)) for s in range(size))
        rows = sum(splits[rank])
        x = np.repeat(np.arange(size, dtype=np.int64)[:, None] + 100 * rank,
                      [splits[rank][p] for p in range(size)], axis=0).reshape(rows, 1)
        response = Response("a2a", RequestType.ALLTOALL, "int64", x.shape, device="cuda",
                            splits=splits)
        kept = []
        entry = _entry(response, _view(x), allocate=lambda shape, k=kept: k.append(
            _view(np.empty(shape, np.int64))) or k[-1])
        executor.execute([response], [entry])
        received_view, received = entry.wait()
        out["alltoall"] = (received_view.host.copy(), received.tolist())
        # reducescatter of 2 * size + 1 rows (uneven), Average with a prescale
        rows = 2 * size + 1
        x = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) * (rank + 1)
        mine_rows = 2 + (1 if rank < 1 else 0)
        response = Response("rs", RequestType.REDUCESCATTER, "float32", x.shape,
                            ReduceOp.AVERAGE, prescale=2.0, device="cuda")
        entry = _entry(response, _view(x), _view(np.empty((mine_rows, 2), np.float32)))
        executor.execute([response], [entry])
        out["reducescatter"] = entry.wait().host.copy()
        return out

    outcome = w.run(rank_main)
    scale = sum(r + 1 for r in range(size))
    for rank, got in enumerate(outcome):
        assert not isinstance(got, BaseException), got
        want = np.concatenate([np.full((r + 1, 3), r + 1, np.int32) for r in range(size)])
        np.testing.assert_array_equal(got["allgather.uneven"], want)
        want = np.concatenate([np.full((2, 3), r + 1, np.int32) for r in range(size)])
        np.testing.assert_array_equal(got["allgather.even"], want)
        np.testing.assert_array_equal(got["broadcast"], np.arange(6) + 10 * (size - 1))
        view, received = got["alltoall"]
        assert received == [(s + rank) % 3 for s in range(size)]
        want = np.concatenate([np.full(((s + rank) % 3, 1), rank + 100 * s, np.int64)
                               for s in range(size)])
        np.testing.assert_array_equal(view, want)
        start = 0 if rank == 0 else 3 + 2 * (rank - 1)
        rows = 3 if rank == 0 else 2
        full = np.arange((2 * size + 1) * 2, dtype=np.float32).reshape(-1, 2)
        np.testing.assert_allclose(got["reducescatter"],
                                   full[start:start + rows] * 2.0 * scale / size, rtol=1e-6)


def test_host_backends_never_see_cuda_views_and_nccl_never_host_ones(world):
    from horovodish.common.execution.backends.mpi import MPIBackend
    w = world(1)
    nccl = NcclBackend(w.comm(0))
    host = MPIBackend.__new__(MPIBackend)  # no MPI needed: only its choice is asked
    manager = OperationManager([nccl, host])
    assert manager.choose(RequestType.ALLREDUCE, "float32", 8, device="cuda") is nccl
    assert manager.choose(RequestType.ALLREDUCE, "float32", 8, device="cuda/host") is host
    assert manager.choose(RequestType.ALLGATHER, "int16", 8, device="cpu") is host
    with pytest.raises(RuntimeError, match="NCCL backend is not in this runtime"):
        OperationManager([host]).choose(RequestType.ALLREDUCE, "float32", 8, device="cuda")


def test_a_device_array_names_its_request_by_its_real_dtype():
    """The torch adapter hands the core a DeviceArray (pointer, device, shape, numpy
    dtype), bfloat16 as ml_dtypes' type, which CuPy cannot name: the core names requests
    by .dtype, and an int16 view (what CuPy would give) is negotiated as int16, which
    NCCL cannot reduce. The adapter's view of a tensor keeps the tensor alive."""
    import torch

    from horovodish.common.api.collectives import reduction_request
    from horovodish.torch.tensor_views import as_cuda_view
    tensor = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)  # (the view reads no
    view = as_cuda_view(tensor)                                   # memory: CPU will do)
    request = reduction_request(RequestType.ALLREDUCE, "g", view, ReduceOp.SUM, 1.0, 1.0,
                                "cuda")
    assert (request.dtype, request.shape) == ("bfloat16", (2, 3))
    assert (view.data.ptr, view.device.id) == (tensor.data_ptr(), tensor.get_device())
    assert (view.itemsize, view.nbytes, view.size, view.ndim) == (2, 12, 6, 2)
    assert view.owner is tensor
    for dtype in (torch.float16, torch.float32, torch.int64, torch.uint8, torch.bool):
        typed = as_cuda_view(torch.zeros(3, dtype=dtype))
        assert typed.dtype == torch.zeros(3, dtype=dtype).numpy().dtype
        assert reduction_request(RequestType.ALLREDUCE, "t", typed, ReduceOp.MAX, 1.0, 1.0,
                                 "cuda").dtype == str(dtype)[len("torch."):]


def test_abort_ends_every_communicator_and_every_later_cuda_collective(world):
    """After a failure (a lost or stalled peer) the runtime aborts its NCCL communicators
    on its own (ncclCommAbort needs no peer), so queued NCCL work and the streams waiting
    on it do not wait for the lost rank; later CUDA collectives raise, naming why."""
    w = world(2)
    communicators = [Communicators(w.comm(r), device_context=_no_context) for r in range(2)]
    created = w.run(lambda r: communicators[r].get(0))
    aborted = []
    for communicator in created:
        communicator.abort = lambda c=communicator: aborted.append(c.rank)
    communicators[0].abort(" by the stall inspector")  # rank 0 alone
    assert aborted == [0]
    with pytest.raises(RuntimeError, match="aborted by the stall inspector"):
        communicators[0].get(0)


def test_a_runtime_that_ends_the_job_aborts_its_device_communication_first():
    """The stall inspector's shutdown and an internal error both end the job through
    Runtime._end_job_after_grace: it aborts the backends' device communication at once,
    before the grace period the script gets to report the error."""
    import types

    from horovodish.common.runtime.thread import Runtime
    reasons: list[str] = []
    stub = types.SimpleNamespace(_stop_reason=" by the stall inspector",
                                 executor=types.SimpleNamespace(abort=reasons.append))
    Runtime._end_job_after_grace(stub, grace=1e9)  # (the job-ending timer never fires)
    assert reasons == [" by the stall inspector"]
