"""The framework-neutral elastic ``run`` loop, in one process with a scripted state."""
from __future__ import annotations

import pytest

from horovodish.common import elastic
from horovodish.common.errors import HorovodInternalError


class ScriptedState(elastic.State):
    """Records what run does to it; its first ``failures`` syncs fail like a lost peer."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.log: list[str] = []

    def save(self) -> None:
        self.log.append("save")

    def restore(self) -> None:
        self.log.append("restore")

    def sync(self) -> None:
        self.log.append("sync")
        if self.failures:
            self.failures -= 1
            raise HorovodInternalError("a peer was lost during the sync")


@pytest.fixture
def resets(monkeypatch):
    done: list[str] = []
    monkeypatch.setattr(elastic, "_reset", lambda: done.append("reset"))
    return done


def test_a_failed_sync_is_retried_like_a_failed_step(resets):
    state = ScriptedState(failures=1)
    state.register_reset_callbacks([lambda: state.log.append("on_reset")])
    result = elastic.run(lambda s, x: x * 2)(state, 21)
    assert result == 42
    assert state.log == ["sync", "restore", "on_reset", "sync"] and resets == ["reset"]


def test_a_failed_step_restores_then_syncs_and_retries(resets):
    state = ScriptedState(failures=0)
    attempts: list[int] = []

    def train(s: ScriptedState) -> str:
        attempts.append(len(attempts))
        if len(attempts) == 1:
            raise HorovodInternalError("allreduce failed")
        return "done"
    assert elastic.run(train)(state) == "done"
    assert attempts == [0, 1] and state.log == ["sync", "restore", "sync"]
    assert resets == ["reset"]


def test_other_errors_propagate(resets):
    def train(s: ScriptedState) -> None:
        raise KeyError("a bug in the script")
    with pytest.raises(KeyError):
        elastic.run(train)(ScriptedState(failures=0))
    assert resets == []
