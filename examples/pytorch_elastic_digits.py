"""Elastic training on scikit-learn's digits: kill a rank and watch the job go on.

    horovodishrun -np 3 --min-np 2 python examples/pytorch_elastic_digits.py

At the start of every generation (each start of the job by the launcher) rank 0 prints
each rank's process id and a command that SIGKILLs rank 1, e.g.

    generation 1: 3 ranks, pids 4242 4243 4244; to kill rank 1: kill -9 4243

Run that command in another terminal: mpirun ends the job, the launcher logs why and
starts it again on the 2 slots left, and training goes on from the last commit (every
10 steps): same epoch, the samples of the epoch not yet used shared out over 2 ranks.
At the end rank 0 prints ``test accuracy: 0.9..`` (about 0.97 whether or not a rank was
killed). Horovod's elastic API: TorchState (model, optimizer, ElasticSampler, epoch),
state.commit(), @hvd.elastic.run; docs/elastic.md.
"""
from __future__ import annotations

import time

_STARTED = time.perf_counter()  # wall time includes the imports and init

import argparse  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from torch import nn  # noqa: E402

import horovodish.torch as hvd  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--commit-every", type=int, default=10, help="steps")
    parser.add_argument("--pace", type=float, default=0.03,
                        help="seconds to wait after each step, time to kill a rank")
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)  # ranks share the machine's cores
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25,
                                                        random_state=args.seed, stratify=y)

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    # The learning rate does not scale with the number of ranks: the job's size changes,
    # and each step's loss is the mean over the global batch whatever the size.
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(range(len(x_train)), shuffle=True, seed=args.seed)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, step=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        pids = hvd.allgather_object(os.getpid())
        if hvd.rank() == 0:
            print(f"generation {os.environ.get('HOROVODISH_ELASTIC_GENERATION', '-')}: "
                  f"{hvd.size()} ranks, pids {' '.join(map(str, pids))}; resuming at epoch "
                  f"{state.epoch}, step {state.step}"
                  + (f"; to kill rank 1: kill -9 {pids[1]}" if len(pids) > 1 else ""),
                  flush=True)
        while state.epoch < args.epochs:
            for batch in range(math.ceil(len(sampler) / args.batch_size)):
                index = sampler.get_indices(batch, args.batch_size)  # no padding
                total = hvd.allreduce(torch.tensor(float(len(index))), op=hvd.Sum,
                                      name="batch_total")
                optimizer.zero_grad()
                # Sum over this rank's samples, scaled so that the ranks' average is the
                # mean over the global batch (a rank's batch may be short or empty).
                loss = F.cross_entropy(model(x_train[index]), y_train[index],
                                       reduction="sum") * hvd.size() / total
                loss.backward()
                optimizer.step()
                sampler.record_batch(batch, args.batch_size)
                state.step += 1
                if state.step % args.commit_every == 0:
                    state.commit()
                time.sleep(args.pace)
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            state.commit()
            if hvd.rank() == 0 and state.epoch % 5 == 0:
                print(f"epoch {state.epoch:3d} done on {hvd.size()} ranks", flush=True)

    train(state)
    model.eval()
    with torch.no_grad():
        mine = slice(hvd.rank(), None, hvd.size())
        correct = (model(x_test[mine]).argmax(1) == y_test[mine]).sum()
        counts = hvd.allreduce(torch.tensor([float(correct), float(len(y_test[mine]))]),
                               name="test_counts", op=hvd.Sum)
    if hvd.rank() == 0:
        print(f"ranks: {hvd.size()}, wall time: {time.perf_counter() - _STARTED:.1f} s",
              flush=True)
        print(f"test accuracy: {float(counts[0] / counts[1]):.4f}", flush=True)


if __name__ == "__main__":
    main()
