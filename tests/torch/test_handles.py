"""Integer handles of horovodish.torch, in one process (a world of one)."""
from __future__ import annotations

import threading
import time

import pytest
import torch

import horovodish.torch as hvd
from horovodish.common.handles import Completions, Handle
from horovodish.torch import async_ops
from horovodish.torch.async_ops import handle_table


@pytest.fixture
def world_of_one():
    hvd.init()
    yield
    hvd.shutdown()


def _core_names(handle: int) -> list[str]:
    handles = handle_table._handles[handle][0]
    return [h.name for h in (handles if isinstance(handles, list) else [handles])]


def test_a_given_name_reaches_the_core_alike_on_every_path(world_of_one):
    """The short path (plain contiguous tensor) and the general one (strided, or needing
    autograd's detach) must agree on names, or ranks whose tensors take different paths
    would negotiate different names and wait for each other forever. A name is Horovod's
    "<op>.<name>"; an empty one counts as none, as in Horovod's binding."""
    plain, strided = torch.ones(4), torch.ones(4, 2)[:, 0]
    graded = torch.ones(4, requires_grad=True)
    handles = [hvd.allreduce_async_(plain, name="w.a"),
               hvd.allreduce_async_(strided, name="w.b"),
               hvd.allreduce_async(plain, name="w.c"),
               hvd.allreduce_async(graded, name="w.d")]
    assert [_core_names(h) for h in handles] == [[f"allreduce.w.{s}"] for s in "abcd"]
    for handle in handles:
        assert torch.equal(hvd.synchronize(handle), torch.ones(4))
    # Unnamed ops number alike on both paths: the short path takes no extra number.
    for name in (None, ""):
        first = hvd.allreduce_async_(plain, name=name)
        second = hvd.allreduce_async_(strided, name=name)
        a, b = _core_names(first)[0], _core_names(second)[0]
        assert a.startswith("allreduce.noname.") and b.startswith("allreduce.noname.")
        assert int(b.rsplit(".", 1)[1]) == int(a.rsplit(".", 1)[1]) + 1, (a, b)
        hvd.synchronize(first), hvd.synchronize(second)
    group = hvd.grouped_allreduce_async([plain, strided], name="g")
    assert _core_names(group) == ["grouped_allreduce.g_1of2", "grouped_allreduce.g_2of2"]
    hvd.synchronize(group)


def test_poll_from_another_thread_while_synchronize_waits():
    """A handle stays known until synchronize has finished waiting on it."""
    completions = Completions()
    pending = Handle("t", completions)
    handle = async_ops.register([pending], lambda results: results[0])
    returned: list = []
    waiter = threading.Thread(target=lambda: returned.append(hvd.synchronize(handle)),
                              daemon=True)
    waiter.start()
    time.sleep(0.1)
    try:
        assert hvd.poll(handle) is False  # not "unknown handle"
    finally:  # never leave the waiter blocked, pass or fail
        pending.finish("done")
        completions.notify()
        waiter.join(10)
    assert returned == ["done"]
    with pytest.raises(ValueError, match="unknown or was already synchronized"):
        hvd.poll(handle)


def test_synchronize_twice_returns_none_as_in_horovod():
    """Horovod returns None for a handle synchronized already (code that waits in a hook
    and again in step() relies on it); a handle never issued still raises."""
    completions = Completions()
    pending = Handle("t", completions)
    handle = async_ops.register([pending], lambda results: results[0])
    pending.finish("done")
    assert hvd.synchronize(handle) == "done"
    assert hvd.synchronize(handle) is None
    with pytest.raises(ValueError, match="unknown"):
        hvd.synchronize(handle + 10 ** 9)
