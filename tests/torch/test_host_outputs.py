"""Result tensors from reused blocks (tensor_views.host_empty), in one process: a block
is never handed out again while any tensor or view made from it is alive."""
from __future__ import annotations

import gc

import torch

from horovodish.torch.tensor_views import host_empty

BIG = (1 << 20, 3)  # 12 MiB of float32: past the size from which blocks are reused


def test_a_held_result_is_never_reused_and_a_dropped_one_is():
    first = host_empty(BIG, torch.float32)
    first.fill_(1.0)
    second = host_empty(BIG, torch.float32)
    assert second.data_ptr() != first.data_ptr()
    second.fill_(2.0)
    assert bool((first == 1.0).all())  # untouched by the second
    view = first[10:20]
    address = first.data_ptr()
    del first
    gc.collect()
    third = host_empty(BIG, torch.float32)
    assert third.data_ptr() not in (address, second.data_ptr())  # the view holds it
    third.fill_(3.0)
    assert bool((view == 1.0).all())
    freed = {address, third.data_ptr()}
    del view, third
    gc.collect()
    again = host_empty(BIG, torch.float32)  # a loop that drops its results reuses
    assert again.data_ptr() in freed
    assert again.shape == BIG and again.dtype == torch.float32


def test_small_results_and_other_dtypes_come_from_torch():
    small = host_empty((16,), torch.float32)
    assert small.shape == (16,) and small.is_cpu
    halves = host_empty((1 << 20, 4), torch.bfloat16)
    assert halves.dtype == torch.bfloat16 and halves.shape == (1 << 20, 4)
    halves.fill_(1.5)
    assert float(halves.float().sum()) == 1.5 * (1 << 22)
    complex_ = host_empty((1 << 20,), torch.complex64)
    assert complex_.dtype == torch.complex64
