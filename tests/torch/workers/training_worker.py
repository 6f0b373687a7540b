"""PyTorch training on real ranks, one job for three modules of named checks (torch's
import costs seconds per rank): DistributedOptimizer and its broadcasts
(optimizer_checks.py), the gradients of the collectives (autograd_checks.py), SyncBatchNorm
and buffer strategies (modules_checks.py). With STAGE_THROUGH_HOST set every tensor takes
the path CUDA tensors take (torch_staging.py), and a last check says that it did.
"""
from __future__ import annotations

import autograd_checks
import modules_checks
import optimizer_checks
import torch
from torch_staging import staging_checks
from worker_support import run_checks

import horovodish.torch as hvd

if __name__ == "__main__":
    checks = [*optimizer_checks.CHECKS, *autograd_checks.CHECKS, *modules_checks.CHECKS,
              *staging_checks()]
    hvd.init()
    torch.set_num_threads(1)
    run_checks(checks, hvd.rank(), hvd.size())
