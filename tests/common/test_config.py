"""Configuration from the environment."""
from __future__ import annotations

import pytest

from horovodish.common.config import Config


def test_defaults():
    config = Config.from_env({})
    assert config.fusion_threshold == 128 * 1024 * 1024
    assert config.cycle_time_ms == 1.0
    assert config.cache_capacity == 1024
    assert config.stall_check_time == 60.0 and config.stall_shutdown_time == 0.0


def test_horovodish_names_win_and_horovod_names_are_accepted():
    config = Config.from_env({"HOROVOD_FUSION_THRESHOLD": "1024", "HOROVOD_CYCLE_TIME": "5",
                              "HOROVODISH_CYCLE_TIME": "2.5", "HOROVOD_CPU_OPERATIONS": "ring"})
    assert config.fusion_threshold == 1024
    assert config.cycle_time_ms == 2.5
    assert config.cpu_operations == "ring"
    assert {"FUSION_THRESHOLD", "CYCLE_TIME", "CPU_OPERATIONS"} <= config.explicit


@pytest.mark.parametrize("key,value", [
    ("HOROVODISH_FUSION_THRESHOLD", "lots"), ("HOROVODISH_CYCLE_TIME", "-1"),
    ("HOROVOD_CACHE_CAPACITY", "1.5"), ("HOROVODISH_CPU_OPERATIONS", "gloo"),
    ("HOROVODISH_AUTOTUNE", "maybe"), ("HOROVODISH_LOG_LEVEL", "loud"),
    # nan passed a `< 0` check and switched the stall inspector off without a word
    ("HOROVODISH_STALL_CHECK_TIME_SECONDS", "nan"), ("HOROVODISH_CYCLE_TIME", "inf"),
])
def test_bad_value_names_the_variable(key, value):
    with pytest.raises(ValueError, match=key):
        Config.from_env({key: value})
