"""``horovod.common.util``, which Horovod's own suites and some scripts import (``env``
around ``init()``, ``is_version_greater_equal_than`` on TensorFlow's version, the
``*_built`` probes), checked against plain Python references."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from horovodish.compat.horovod_paths import common_util as util
from horovodish.common.messages import Average, Sum
from test_horovod_scripts import alias_env


def test_the_alias_gives_this_module():
    code = ("import horovod.common.util as u, horovodish.compat.horovod_paths.common_util as h; "
            "from horovod.common.util import env, is_version_greater_equal_than; "
            "assert u is h and env is h.env; print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, **alias_env()})
    assert result.stdout.strip() == "ok", result.stderr


def test_env_sets_and_restores_the_variables():
    os.environ["HVDISH_KEPT"] = "before"
    os.environ.pop("HVDISH_NEW", None)
    try:
        with util.env(HVDISH_KEPT="during", HVDISH_NEW="new", HVDISH_SKIPPED=None):
            assert os.environ["HVDISH_KEPT"] == "during" and os.environ["HVDISH_NEW"] == "new"
            assert "HVDISH_SKIPPED" not in os.environ
        assert os.environ["HVDISH_KEPT"] == "before" and "HVDISH_NEW" not in os.environ
        with pytest.raises(RuntimeError):  # restored on the way out of an error too
            with util.env(HVDISH_KEPT="during"):
                raise RuntimeError
        assert os.environ["HVDISH_KEPT"] == "before"
    finally:
        os.environ.pop("HVDISH_KEPT", None)


@pytest.mark.parametrize("length,parts", [(10, 3), (3, 5), (0, 2), (12, 4), (7, 1)])
def test_split_list_covers_the_list_in_even_consecutive_parts(length, parts):
    items = list(range(length))
    chunks = util.split_list(items, parts)
    assert len(chunks) == parts and [x for chunk in chunks for x in chunk] == items
    sizes = [len(chunk) for chunk in chunks]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_small_helpers():
    assert [n for n in range(-2, 40) if util.num_rank_is_power_2(n)] == [1, 2, 4, 8, 16, 32]
    assert util.is_iterable([1]) and util.is_iterable("ab") and not util.is_iterable(3)
    assert util.is_version_greater_equal_than("2.16.1", "2.6.0")
    assert util.is_version_greater_equal_than("2.6.0", "2.6.0")
    assert not util.is_version_greater_equal_than("2.5.9", "2.6.0")
    assert util.is_version_greater_equal_than("2.17.0rc1", "2.17.0")
    with pytest.raises(ValueError, match="X.Y.Z"):
        util.is_version_greater_equal_than("2.6", "2.6")
    with pytest.raises(ValueError, match="strings"):
        util.is_version_greater_equal_than(2.6, "2.6.0")
    calls = []

    @util._cache
    def probe(x):
        calls.append(x)
        return x * 2
    assert (probe(3), probe(3), probe(4)) == (6, 6, 8) and calls == [3, 4]


def test_average_flag_compatibility():
    resolve = util.get_average_backwards_compatibility_fun(sys.modules[__name__])
    assert resolve(None, None) is Average and resolve(Sum, None) is Sum
    with pytest.warns(DeprecationWarning):
        assert resolve(None, False) is Sum
    with pytest.raises(ValueError, match="not both"):
        resolve(Sum, True)


def test_extensions_and_builds():
    assert util.extension_available("torch") and util.extension_available("horovod.torch")
    assert util.extension_available("tensorflow")
    assert not util.extension_available("mxnet")
    with pytest.raises(ImportError, match="mxnet"):
        util.check_extension("horovod.mxnet", "HOROVOD_WITH_MXNET", __file__)
    util.check_extension("horovod.torch", "HOROVOD_WITH_PYTORCH", __file__)
    assert util.mpi_built() and not util.gloo_built() and not util.ccl_built()
    import torch
    assert util.gpu_available("torch") == (torch.cuda.is_available() and util.cuda_built())


def test_the_frameworks_modules_carry_horovods_helpers():
    """Horovod's packages and mpi_ops modules import these helpers into their namespace,
    and its suites call them there (hvd.gpu_available in test_adasum_tensorflow.py)."""
    code = ("import horovod.tensorflow as tf_hvd, horovod.torch as torch_hvd\n"
            "from horovod.torch import mpi_ops as torch_ops\n"
            "from horovod.tensorflow import mpi_ops as tf_ops\n"
            "from horovod.common.util import gpu_available\n"
            "assert tf_hvd.gpu_available is gpu_available is torch_ops.gpu_available\n"
            "assert tf_hvd.split_list([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]\n"
            "assert tf_hvd.check_num_rank_power_of_2(8) and not tf_ops.num_rank_is_power_2(6)\n"
            "for ops in (tf_ops, torch_ops):\n"
            "    pick = ops.handle_average_backwards_compatibility\n"
            "    assert pick(None, None) == ops.Average and pick(ops.Sum, None) == ops.Sum\n"
            "    assert ops.gpu_available is gpu_available\n"
            "assert torch_hvd.check_extension is tf_hvd.check_extension\n"
            "print('ok')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, **alias_env()})
    assert result.stdout.strip() == "ok", result.stderr
