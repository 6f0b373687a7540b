"""Jobs in which one rank misbehaves on purpose while CUDA tensors travel through NCCL
between ranks on the one GPU (each rank under tests/gpu/distinct_hosts.py); the test
reads how the job ends. Scenarios (the first argument names one):

- killed_mid_collective (elastic): in the first generation rank 1 submits three 64 MiB
  allreduces, waits for the first, then SIGKILLs itself while the others are in NCCL;
  the job must go on at one rank from the last commit and finish;
- stalls: rank 1 never submits 'lonely_tensor' (rank 0 does, after NCCL allreduces); the
  stall inspector must name the rank and the tensor and end the job;
- freezes_mid_collective: rank 1 submits three 64 MiB allreduces, waits for the first,
  then stops itself (SIGSTOP) while the others are in NCCL; rank 0's next negotiation
  waits for it, names it and ends the job (aborting NCCL, killing the stopped rank).
"""
from __future__ import annotations

import os
import signal
import time

import torch

from worker_support import check, run_scenario  # noqa: E402

import horovodish.torch as hvd  # noqa: E402
from horovodish.common.runtime import launcher_link  # noqa: E402

BIG = 16 << 20  # float32 values: 64 MiB, long enough on loopback sockets to be mid-flight


def _start() -> None:
    hvd.init()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())


def killed_mid_collective(rank: int, size: int) -> None:
    _start()
    model = torch.nn.Linear(256, 256).cuda()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)
    big = [torch.ones(BIG, device="cuda") for _ in range(3)]
    data = torch.randn(32, 256, device="cuda")

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.step < 20:
            optimizer.zero_grad()
            model(data).square().mean().backward()
            optimizer.step()
            handles = [hvd.allreduce_async_(tensor, op=hvd.Average, name=f"big.{i}")
                       for i, tensor in enumerate(big)]
            hvd.synchronize(handles[0])
            if state.step == 12 and hvd.rank() == 1 and launcher_link.generation() == 1:
                os.kill(os.getpid(), signal.SIGKILL)  # big.1 and big.2 are in NCCL
            for handle in handles[1:]:
                hvd.synchronize(handle)
            for tensor in big:  # the average of ones
                check(bool(torch.all(tensor == 1)), f"an average of ones at step {state.step}")
            state.step += 1
            if state.step % 5 == 0:
                state.commit()
    train(state)
    check(launcher_link.generation() > 1, "the job never lost rank 1")


def stalls(rank: int, size: int) -> None:
    _start()
    x = torch.ones(BIG, device="cuda")
    for step in range(3):
        hvd.allreduce_(x, op=hvd.Average, name="before")
    torch.cuda.synchronize()
    if rank == 1:
        time.sleep(120)  # never submits; the job must still end
    else:
        hvd.allreduce_(torch.ones(8, device="cuda"), name="lonely_tensor")


def freezes_mid_collective(rank: int, size: int) -> None:
    _start()
    big = [torch.ones(BIG, device="cuda") for _ in range(3)]
    for step in range(20):
        handles = [hvd.allreduce_async_(tensor, op=hvd.Average, name=f"big.{i}")
                   for i, tensor in enumerate(big)]
        hvd.synchronize(handles[0])
        if step == 5 and rank == 1:
            os.kill(os.getpid(), signal.SIGSTOP)  # big.1 and big.2 are in NCCL
        for handle in handles[1:]:
            hvd.synchronize(handle)
        torch.cuda.synchronize()


if __name__ == "__main__":
    run_scenario([killed_mid_collective, stalls, freezes_mid_collective])
