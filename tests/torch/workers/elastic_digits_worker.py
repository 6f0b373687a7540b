"""An elastic job on the digits (float64 MLP, ElasticSampler, SGD with momentum), run
under ``horovodishrun --min-np``: it logs every step's batch and every commit, so that the
test can check what survived a failure against a replay of the same schedule.

    elastic_digits_worker.py LOG_DIR [--kill RANK STEP] [--grow HOSTS_FILE TEXT STEP]
                                     [--ready FILE STEP]

--kill: in the first generation, rank RANK SIGKILLs itself after step STEP (a step that
        is not a commit, so some work is rolled back).
--grow: in the first generation, rank 0 writes TEXT to HOSTS_FILE (what the discovery
        script prints) after step STEP, then each step takes 0.1 s until the launcher's
        answer at a commit ends the generation.
--ready: in the first generation, rank 0 creates FILE after step STEP (the test then
        pulls a host's link), and from then on each step takes 0.2 s.
Logs: LOG_DIR/g<generation>-r<rank>.jsonl, one JSON object a line: ``resume`` (rank 0,
where the generation starts), ``step`` (every rank: its real indices), ``commit`` (rank
0, after commit() returned); the last generation's rank 0 saves final.pt.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import time
from pathlib import Path

import importlib.util

import numpy as np
import torch
import torch.nn.functional as F

from worker_support import check, run_checks, same_on_every_rank  # noqa: E402

import horovodish.torch as hvd  # noqa: E402
from horovodish.common.runtime import launcher_link  # noqa: E402

BATCH = 16        # per rank
COMMIT_EVERY = 5  # steps
EPOCHS = 2


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 10)).double()


def data() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's digits, read from its data file: what load_digits returns, without
    importing scikit-learn (a second of CPU per rank, and every rank starts twice)."""
    package = importlib.util.find_spec("sklearn").submodule_search_locations[0]
    table = np.loadtxt(Path(package) / "datasets" / "data" / "digits.csv.gz", delimiter=",")
    return (torch.tensor(table[:, :-1] / 16.0, dtype=torch.float64),
            torch.tensor(table[:, -1], dtype=torch.int64))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("log_dir", type=Path)
    parser.add_argument("--kill", nargs=2, type=int, metavar=("RANK", "STEP"))
    parser.add_argument("--grow", nargs=3, metavar=("HOSTS_FILE", "TEXT", "STEP"))
    parser.add_argument("--ready", nargs=2, metavar=("FILE", "STEP"))
    args = parser.parse_args()
    hvd.init()
    rank, size, generation = hvd.rank(), hvd.size(), launcher_link.generation()
    log_file = open(args.log_dir / f"g{generation}-r{rank}.jsonl", "a", buffering=1)

    def log(**record) -> None:
        log_file.write(json.dumps({"generation": generation, "rank": rank, **record}) + "\n")

    x, y = data()
    model = build_model()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(range(len(x)), shuffle=True, seed=7)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, step=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        if rank == 0:
            log(kind="resume", step=state.step, epoch=state.epoch, size=size,
                seq=state._commit_seq, time=time.time())
        while state.epoch < EPOCHS:
            for batch in range(math.ceil(len(sampler) / BATCH)):
                indices = sampler.get_indices(batch, BATCH)
                total = hvd.allreduce(torch.tensor(float(len(indices))), op=hvd.Sum,
                                      name="elastic.count")
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x[indices]), y[indices], reduction="sum")
                (loss * size / total).backward()
                optimizer.step()
                sampler.record_batch(batch, BATCH)
                state.step += 1
                log(kind="step", step=state.step, epoch=state.epoch, indices=indices)
                if state.step % COMMIT_EVERY == 0:
                    commit(state)
                if generation == 1 and args.kill and args.kill == [rank, state.step]:
                    os.kill(os.getpid(), signal.SIGKILL)
                if generation == 1 and args.grow:
                    if rank == 0 and state.step == int(args.grow[2]):
                        Path(args.grow[0]).write_text(args.grow[1] + "\n")
                    if state.step >= int(args.grow[2]):
                        time.sleep(0.1)
                if generation == 1 and args.ready and state.step >= int(args.ready[1]):
                    if rank == 0 and state.step == int(args.ready[1]):
                        Path(args.ready[0]).touch()
                    time.sleep(0.2)
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            commit(state)

    def commit(state: hvd.elastic.TorchState) -> None:
        try:
            state.commit()
        except hvd.HostsUpdatedInterrupt:  # committed, and the job restarts on new hosts
            log_commit(state)
            raise
        log_commit(state)

    def log_commit(state: hvd.elastic.TorchState) -> None:
        if rank == 0:
            log(kind="commit", step=state.step, epoch=state.epoch, seq=state._commit_seq,
                time=time.time())

    train(state)
    if rank == 0:
        torch.save(model.state_dict(), args.log_dir / "final.pt")

    def same_model_everywhere(rank: int, size: int) -> None:
        for name, value in model.state_dict().items():
            same_on_every_rank(value, name)
        check(not args.grow or generation > 1, "the job never grew")

    run_checks([same_model_everywhere], rank, size)


if __name__ == "__main__":
    main()
