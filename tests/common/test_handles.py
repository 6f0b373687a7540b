"""Handles finish without a lock each; a blocked caller must still never miss a wake-up."""
from __future__ import annotations

import threading
import time

import pytest

from horovodish.common.handles import Completions, Handle, wait_all


def test_wait_returns_the_result_finished_by_another_thread():
    kicks = []
    completions = Completions(lambda handle, timeout: kicks.append((handle.name, timeout)))
    handle = Handle("t", completions)

    def finish_later() -> None:
        time.sleep(0.05)
        handle.finish([1, 2])
        completions.notify()

    threading.Thread(target=finish_later).start()
    start = time.perf_counter()
    assert handle.wait(timeout=30) == [1, 2]
    assert time.perf_counter() - start < 5  # woken by notify, not by the timeout
    assert kicks == [("t", 30)]  # a blocked caller asks the runtime not to wait for more
    assert handle.wait() == [1, 2] and kicks == [("t", 30)]  # done: no kick, no blocking


def test_errors_reach_the_caller_and_timeouts_name_the_tensor():
    completions = Completions()
    handle = Handle("grad.w", completions)
    with pytest.raises(TimeoutError, match="grad.w"):
        handle.wait(timeout=0.01)
    handle.finish(error=ValueError("boom"))
    completions.notify()
    with pytest.raises(ValueError, match="boom"):
        handle.wait()


def test_no_lost_wake_up_under_races():
    """A finisher notifies once per batch while a waiter blocks on the batch's last
    handle: thousands of rounds, each woken promptly."""
    completions = Completions()
    rounds = 3000
    batches = [[Handle(f"h{r}.{i}", completions) for i in range(4)] for r in range(rounds)]

    def finisher() -> None:
        for batch in batches:
            time.sleep(0)  # let the waiter get ahead and block, as a caller does
            for handle in batch:
                handle.finish(handle.name)
            completions.notify()

    thread = threading.Thread(target=finisher)
    start = time.perf_counter()
    thread.start()
    for batch in batches:
        # A lost wake-up would sit out the whole timeout.
        assert batch[-1].wait(timeout=30) == batch[-1].name
    assert time.perf_counter() - start < 10
    thread.join(5)
    assert completions.waiters == 0


@pytest.mark.parametrize("by_group", [False, True])
def test_a_finished_entry_no_longer_holds_the_tensors(by_group: bool):
    """An entry is the caller's handle: once finished (alone, or with its group by
    finish_all) it must not keep the input (a training step's old gradient) or the
    output alive for as long as the caller keeps the handle."""
    import gc
    import weakref

    import numpy as np

    from horovodish.common.entry import Entry, finish_all
    from horovodish.common.messages import Request, RequestType

    tensor, output = np.ones(4), np.zeros(4)
    entry = Entry(Request("t", RequestType.ALLREDUCE, "float64", (4,)), tensor, Completions(),
                  output)
    refs = [weakref.ref(tensor), weakref.ref(output)]
    del tensor, output
    gc.collect()
    assert all(ref() is not None for ref in refs)  # held while in flight
    if by_group:
        finish_all([None, entry], [None, "result"])  # None: a joined rank's place
    else:
        entry.finish("result")
    gc.collect()
    assert [ref() for ref in refs] == [None, None]
    assert entry.wait() == "result" and entry.name == "t"


def test_one_notify_wakes_every_waiter_and_each_waits_on_for_its_own_handle():
    completions = Completions()
    first, second = Handle("first", completions), Handle("second", completions)
    got: dict[str, object] = {}
    threads = [threading.Thread(target=lambda h=h: got.setdefault(h.name, h.wait(30)))
               for h in (first, second)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while completions.waiters < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert completions.waiters == 2
    first.finish(1)
    completions.notify()  # wakes both; "second" is not done and waits again
    threads[0].join(5)
    assert got == {"first": 1} and threads[1].is_alive()
    deadline = time.monotonic() + 5
    while completions.waiters < 1 and time.monotonic() < deadline:
        time.sleep(0.001)
    second.finish(2)
    completions.notify()
    threads[1].join(5)
    assert got == {"first": 1, "second": 2} and completions.waiters == 0


def test_a_ctrl_c_during_a_wait_leaves_no_waiter_behind():
    """A KeyboardInterrupt out of a blocked wait (a Condition's wait could leave the
    shared lock released by the wrong party): the waiter is gone, and the handle can
    be waited on again."""
    import os
    import signal

    completions = Completions()
    handle = Handle("grad.b", completions)

    def interrupt(signum, frame):
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            handle.wait(timeout=10)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert completions.waiters == 0
    threading.Timer(0.05, lambda: (handle.finish("late"), completions.notify())).start()
    assert handle.wait(timeout=10) == "late"
    assert completions.waiters == 0


def test_wait_all_waits_for_every_handle_then_raises_the_first_error():
    completions = Completions()
    handles = [Handle(name, completions) for name in ("a", "b", "c", "d")]
    handles[0].finish(0)
    handles[1].finish(error=ValueError("b failed"))
    handles[2].finish(error=KeyError("c failed"))
    handles[3].finish(3)
    waited = []

    def wait(handle: Handle) -> object:
        waited.append(handle.name)
        return handle.wait()

    with pytest.raises(ValueError, match="b failed"):
        wait_all(handles, wait)
    assert waited == ["a", "b", "c", "d"]
    assert wait_all([handles[0], handles[3]]) == [0, 3]


def test_wait_all_stops_at_once_on_an_exception_it_is_told_to_pass():
    class Stop(RuntimeError):
        pass

    completions = Completions()
    handles = [Handle(name, completions) for name in ("a", "b", "c")]
    handles[0].finish(error=ValueError("a failed"))
    waited = []

    def wait(handle: Handle) -> object:
        waited.append(handle.name)
        if handle.name == "b":
            raise Stop("interrupted")
        return handle.wait()

    with pytest.raises(Stop):
        wait_all(handles, wait, stop_on=(Stop,))
    assert waited == ["a", "b"]
