"""``horovod.runner.util.threads`` and ``horovod.runner.common.util.env`` (Horovod's
test utilities and suites import ``in_thread`` and ``get_env_rank_and_size`` from them):
results and errors checked against plain expectations."""
from __future__ import annotations

import threading

import pytest

from horovodish.compat.horovod_paths.runner.common.util.env import get_env_rank_and_size
from horovodish.compat.horovod_paths.runner.util.threads import in_thread, on_event


def test_in_thread_runs_the_target_with_its_arguments():
    seen: list[tuple[int, str]] = []
    thread = in_thread(lambda a, b: seen.append((a, b)), args=(7, "x"), name="worker")
    thread.join(5)
    assert seen == [(7, "x")] and thread.name == "worker" and thread.daemon


def test_in_thread_refuses_arguments_that_are_not_a_tuple():
    with pytest.raises(ValueError, match="args must be a tuple, not list"):
        in_thread(print, args=[1])


def test_silent_swallows_the_targets_error():
    errors: list[BaseException] = []
    previous = threading.excepthook
    threading.excepthook = lambda hook_args: errors.append(hook_args.exc_value)
    try:
        def fail() -> None:
            raise RuntimeError("boom")
        in_thread(fail, silent=True).join(5)
        assert errors == []
        in_thread(fail).join(5)
        assert [str(e) for e in errors] == ["boom"]
    finally:
        threading.excepthook = previous


def test_on_event_runs_once_the_event_is_set_and_never_after_stop():
    event, stop = threading.Event(), threading.Event()
    calls: list[int] = []
    waiting = on_event(event, calls.append, args=(1,), stop=stop, check_stop_interval_s=0.01)
    assert waiting.is_alive() and calls == []
    event.set()
    waiting.join(5)
    assert calls == [1]
    stopped = on_event(threading.Event(), calls.append, args=(2,), stop=stop,
                       check_stop_interval_s=0.01)
    stop.set()
    stopped.join(5)
    assert not stopped.is_alive() and calls == [1]


def test_on_event_needs_a_stop_event_for_a_thread_that_is_not_a_daemon():
    with pytest.raises(ValueError, match="needs a stop event"):
        on_event(threading.Event(), print, daemon=False)
    with pytest.raises(ValueError, match="event must not be None"):
        on_event(None, print)


@pytest.mark.parametrize("variables,expected", [
    ({}, (0, 1)),
    ({"PMI_RANK": "2", "PMI_SIZE": "4"}, (2, 4)),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3", "PMI_RANK": "0",
      "PMI_SIZE": "2"}, (1, 3)),  # Open MPI's pair before PMI's, as in Horovod
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "PMI_RANK": "1", "PMI_SIZE": "2"}, (0, 2)),
])
def test_rank_and_size_from_the_launchers_variables(monkeypatch, variables, expected):
    for name in ("HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert get_env_rank_and_size() == expected


def test_half_a_pair_is_an_error(monkeypatch):
    for name in ("HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_RANK",
                 "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    with pytest.raises(RuntimeError, match="only one of OMPI_COMM_WORLD_RANK and "
                                           "OMPI_COMM_WORLD_SIZE"):
        get_env_rank_and_size()
