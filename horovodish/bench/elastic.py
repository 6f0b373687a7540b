"""What elastic training costs: a commit, committing every 10 steps, and recovering from a
killed rank (docs/tuning.md, "Elastic").

    horovodishrun -np 2 --min-np 1 python -m horovodish.bench.elastic --model mlp
    horovodishrun -np 2 --min-np 1 python -m horovodish.bench.elastic --model 100mb

``mlp`` is examples/pytorch_ddp_compare.py's (784-1024-1024-1024-10, 11.6 MB of float32),
``100mb`` one 5000x5000 linear layer (100 MB); SGD, batch 64 per rank on synthetic data,
an ElasticSampler over 60,000 samples in the state.

Generation 1 runs --rounds rounds, each 10 steps without a commit and 10 steps ending in
one (alternating, so neither gets a quieter machine), and prints the median time of a
commit and of its parts (save in memory: the state dicts copied and the sampler's
indices gathered; write: each host's first rank writes the commit file; agree: the
allreduce that waits for every host's write and carries rank 0's question to the
launcher) and the median step rate with and without. Then rank 1 SIGKILLs itself after
an uncommitted step, and generation 2 prints the recovery, from the kill to the end of
the first step: detection (until the launcher starts the next mpirun: mpirun's cleanup,
the launcher's decision), relaunch (until the new ranks' state is built: processes,
imports, init()), restore (the first sync: agreeing on the newest commit, reading it,
broadcasting it) and the first step.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

STARTED = time.time()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import horovodish.torch as hvd  # noqa: E402
from horovodish.common import elastic_store  # noqa: E402
from horovodish.common.runtime import launcher_link  # noqa: E402

BATCH, SAMPLES, EVERY = 64, 60_000, 10


def build(model: str) -> tuple[nn.Module, int, int]:
    """(model, input features, classes)."""
    torch.manual_seed(0)
    if model == "mlp":
        return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024),
                             nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                             nn.Linear(1024, 10)), 784, 10
    return nn.Sequential(nn.Linear(5000, 5000)), 5000, 5000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["mlp", "100mb"], default="mlp")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if not launcher_link.enabled():
        sys.exit("run it under horovodishrun --min-np 1 (see the docstring)")
    hvd.init()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    initialized = time.time()
    rank, generation = hvd.rank(), launcher_link.generation()
    model, features, classes = build(args.model)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.001),
                                         named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(range(SAMPLES), shuffle=True)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, step=0)
    generator = torch.Generator().manual_seed(rank)
    data = torch.randn(BATCH, features, generator=generator)
    target = torch.randint(0, classes, (BATCH,), generator=generator)
    marker = Path(os.environ[elastic_store.ENV_DIR]) / "bench-killed-at"
    ready = time.time()

    def step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()
        sampler.record_batch(state.step % max(1, len(sampler) // BATCH), BATCH)
        state.step += 1

    def commit(parts: list[tuple[float, float, float]]) -> None:
        # state.commit(), timed by part (the same three calls).
        t0 = time.perf_counter()
        state.save()
        t1 = time.perf_counter()
        state._commit_seq += 1
        state._persist()
        t2 = time.perf_counter()
        state.check_host_updates()
        parts.append((t1 - t0, t2 - t1, time.perf_counter() - t2))

    def rate(steps: int, parts: list | None) -> float:
        hvd.barrier()
        started = time.perf_counter()
        for _ in range(steps):
            step()
        if parts is not None:
            commit(parts)
        hvd.barrier()
        return steps / (time.perf_counter() - started)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        synced = time.time()
        if generation > 1:
            step()
            first = time.time()
            if rank == 0:
                report_recovery(float(marker.read_text()), synced, first)
            return
        for _ in range(2):  # warm-up, the writer's first file included
            rate(EVERY, [])
        plain, committing, parts = [], [], []
        for _ in range(args.rounds):
            plain.append(rate(EVERY, None))
            committing.append(rate(EVERY, parts))
        if rank == 0:
            report_commits(plain, committing, parts)
        step()  # not committed: rolled back
        hvd.barrier()
        if rank == 1:
            marker.write_text(f"{time.time():.6f}")
            os.kill(os.getpid(), signal.SIGKILL)
        hvd.barrier()  # never returns: mpirun ends the job

    def report_commits(plain: list[float], committing: list[float], parts: list) -> None:
        folder = elastic_store.directory()
        size = (folder / f"commit-{elastic_store.newest(folder):012d}.bin").stat().st_size
        save, write, agree = (statistics.median(p[i] for p in parts) for i in range(3))
        total = statistics.median(sum(p) for p in parts)
        slower = 1 - statistics.median(committing) / statistics.median(plain)
        bound = total / (total + EVERY / statistics.median(plain))
        print(f"{args.model} on {hvd.size()} ranks: commit {total * 1e3:.1f} ms (save "
              f"{save * 1e3:.1f}, write {write * 1e3:.1f}, agree "
              f"{agree * 1e3:.1f}) for {size / 1e6:.1f} MB on disk; "
              f"{statistics.median(plain):.2f} steps/s without commits, "
              f"{statistics.median(committing):.2f} committing every {EVERY}: "
              f"{100 * slower:.1f}% slower (the commit's time is {100 * bound:.1f}% of "
              f"{EVERY} steps and a commit)", flush=True)
        print("JSON " + json.dumps({"model": args.model, "ranks": hvd.size(), "bytes": size,
                                    "commit_s": total, "save_s": save, "write_s": write,
                                    "agree_s": agree,
                                    "rate_plain": plain, "rate_committing": committing}),
              flush=True)

    def report_recovery(killed: float, synced: float, first: float) -> None:
        launched = float(os.environ[launcher_link.ENV_LAUNCHED_AT])
        phases = {"detection": launched - killed, "relaunch": ready - launched,
                  "restore": synced - ready, "first step": first - synced}
        print(f"{args.model}: recovery {first - killed:.2f} s from the kill to the end of "
              f"the first step on {hvd.size()} rank(s): "
              + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in phases.items())
              + f" (of the relaunch: mpirun and Python start {STARTED - launched:.2f} s, "
              f"imports and init() {initialized - STARTED:.2f} s, model and state "
              f"{ready - initialized:.2f} s)", flush=True)
        print("JSON " + json.dumps({"model": args.model, **phases,
                                    "start": STARTED - launched,
                                    "imports_init": initialized - STARTED,
                                    "build": ready - initialized}), flush=True)

    train(state)


if __name__ == "__main__":
    main()
