"""A script written for Horovod (``import horovod.torch as hvd``), run unchanged through
the alias: the behaviours Horovod's own torch suite relies on, against numpy."""
from __future__ import annotations


import numpy as np
import torch

import horovod.torch as hvd  # the alias: horovodish.torch

from worker_support import check, close, run_checks  # noqa: E402


def the_alias_is_horovodish(rank: int, size: int) -> None:
    import horovodish.torch
    check(hvd is horovodish.torch, "horovod.torch is horovodish.torch itself")
    from horovod.common.exceptions import HorovodInternalError
    check(issubclass(HorovodInternalError, RuntimeError), "Horovod's error class")


def sparse_handle_is_callable(rank: int, size: int) -> None:
    indices = torch.tensor([[rank, rank + 1]])
    sparse = torch.sparse_coo_tensor(indices, torch.tensor([1.0, 2.0]), (size + 1,))
    handle = hvd.sparse_allreduce_async(sparse, name="sparse", op=hvd.Sum)
    dense = handle().to_dense().numpy()  # Horovod's handle is a function
    want = np.zeros(size + 1)
    for r in range(size):
        want[r] += 1.0
        want[r + 1] += 2.0
    close(dense, want, "sparse allreduce through the callable handle")


def prescale_is_horovods_arithmetic(rank: int, size: int) -> None:
    factor = 0.6180339887498949
    tensor = torch.arange(-8, 9, dtype=torch.float16) * 1.37
    summed = hvd.allreduce(tensor, op=hvd.Sum, prescale_factor=factor, name="pre")
    scaled = (tensor.float() * torch.tensor(factor, dtype=torch.float32)).half()
    if size == 2:  # one addition: exact whatever the order (Horovod's own test is exact here)
        close(summed.float(), (scaled.float() * 2).half().float(),
              "float16 prescale: float32 math, one rounding, then the sum")
    else:  # the order of the half additions decides the last bit
        exact = scaled.double() * size
        ulp = torch.finfo(torch.float16).eps * exact.abs().clamp(min=1.0)
        check(bool(((summed.double() - exact).abs() <= 2 * ulp).all()),
              f"float16 prescale within two ulps: {summed} against {exact}")


def reducescatter_gradient_is_horovods(rank: int, size: int) -> None:
    tensor = torch.ones(size * 2, 3, requires_grad=True)
    out = hvd.reducescatter(tensor, op=hvd.Sum, name="rs")
    out.backward(torch.ones_like(out))
    close(tensor.grad, np.full((size * 2, 3), float(size)),
          "Sum: all-ones upstream gives size on every element")


def optimizer_names_parameters(rank: int, size: int) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    names = sorted(optimizer._parameter_names.values())
    check(len(names) == 4 and all(n.startswith("allreduce.noname.") for n in names),
          f"Horovod's default parameter names: {names}")


def broadcast_state_with_a_frozen_parameter(rank: int, size: int) -> None:
    model = torch.nn.Linear(3, 1)
    model.bias.requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    check(model.weight.grad is not None, "a zero gradient after broadcast_optimizer_state")


if __name__ == "__main__":
    hvd.init()
    run_checks([the_alias_is_horovodish, sparse_handle_is_callable,
                prescale_is_horovods_arithmetic, reducescatter_gradient_is_horovods,
                optimizer_names_parameters, broadcast_state_with_a_frozen_parameter],
               hvd.rank(), hvd.size())
