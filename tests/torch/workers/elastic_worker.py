"""hvd.elastic: TorchState commit/restore/sync round trips, and run() retrying after a
HorovodInternalError from a deliberate mismatch on the first attempt."""
from __future__ import annotations

import warnings
from types import SimpleNamespace

import torch

from worker_support import check, close, run_checks  # noqa: E402

import horovodish.torch as hvd  # noqa: E402


def commit_and_restore(rank: int, size: int, run: SimpleNamespace) -> None:
    """A commit / restore round trip, locally."""
    model, optimizer, state = run.model, run.optimizer, run.state
    model(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    state.epoch = 3
    state.commit()
    committed = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = optimizer.state_dict()["state"][0]["momentum_buffer"].clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    optimizer.state[model.weight]["momentum_buffer"].zero_()
    state.epoch, state.batch = 7, 9
    state.restore()
    for k, v in committed.items():
        check(torch.equal(model.state_dict()[k], v), f"{k} not restored")
    check(torch.equal(optimizer.state_dict()["state"][0]["momentum_buffer"], momentum),
          "momentum not restored")
    check((state.epoch, state.batch) == (3, 0), f"epoch, batch {(state.epoch, state.batch)}")


def run_retries_after_a_failure(rank: int, size: int, run: SimpleNamespace) -> None:
    """A mismatch on purpose in the first attempt: every rank retries from the commit."""
    model, state = run.model, run.state
    attempts = []

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> int:
        attempts.append(state.epoch)
        # after sync every rank holds rank 0's weights
        weights = hvd.allgather_object(model.weight.detach().clone())
        check(all(torch.equal(w, weights[0]) for w in weights), "sync did not align ranks")
        if len(attempts) == 1:
            state.epoch = 99  # progress that is lost with the failure
            # a mismatch on purpose: HorovodInternalError on every rank
            hvd.allreduce(torch.ones(2 + rank), name="elastic.mismatch")
        return state.epoch

    result = train(state)
    check(len(attempts) == 2, f"attempts {attempts}")
    check(result == 3 and attempts == [3, 3],  # restored from the commit
          f"result {result}, attempts {attempts}")
    check(hvd.is_initialized(), "not initialized after the retry")


def kept_in_place(rank: int, size: int, run: SimpleNamespace) -> None:
    """Extra models, LR schedulers and an ElasticSampler given as keywords are the
    user's own objects, restored and synced in place (they were replaced by copies, so
    a second model never synced and a scheduler drove a phantom optimizer)."""
    torch.manual_seed(10 + rank)  # ranks start different
    model, critic = torch.nn.Linear(3, 1), torch.nn.Linear(2, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0,
                                                         momentum=0.9),
                                         named_parameters=model.named_parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.1)
    dataset = list(range(10))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
    if rank == 1:
        with warnings.catch_warnings():  # (torch warns of a scheduler step before any step)
            warnings.simplefilter("ignore")
            scheduler.step()  # a rank whose scheduler is ahead: sync() must fix it
    state = hvd.elastic.TorchState(model, optimizer, critic=critic, scheduler=scheduler,
                                   sampler=sampler, epoch=0)
    check(state.critic is critic and state.scheduler is scheduler and state.sampler is sampler,
          "members replaced by copies")
    state.sync()
    critics = hvd.allgather_object(critic.weight.detach().clone())
    check(all(torch.equal(c, critics[0]) for c in critics), "second model not synced")
    check(optimizer.param_groups[0]["lr"] == 1.0 and scheduler.last_epoch == 0,
          f"scheduler not synced: lr {optimizer.param_groups[0]['lr']}")
    # Each rank processes its first batch of 2, then everything is committed.
    mine = list(sampler)
    check(len(mine) == 5, f"sampler gave {len(mine)} of 10 indices on one of 2 ranks")
    sampler.record_batch(0, 2)
    seen = set(mine[:2])
    optimizer.zero_grad()
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    state.commit()
    committed = optimizer.state_dict()["state"][0]["momentum_buffer"].clone()
    # Two more steps, restored twice: the saved momentum must not follow the live one.
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.ones(2, 3)).sum().backward()
        optimizer.step()
        scheduler.step()
        state.restore()
        momentum = optimizer.state_dict()["state"][0]["momentum_buffer"]
        check(torch.equal(momentum, committed), "restore did not bring the commit back")
        check(abs(optimizer.param_groups[0]["lr"] - 0.1) < 1e-12 and scheduler.last_epoch == 1,
              f"scheduler not restored: lr {optimizer.param_groups[0]['lr']}")
    # After a sync, the remaining 6 indices are shared out afresh, none of them seen.
    state.sync()
    processed = set().union(*hvd.allgather_object(seen))
    check(sampler.processed_indices == processed, "processed indices not the union")
    rest = list(sampler)
    everyone = hvd.allgather_object(rest)
    check(len(rest) == 3 and set().union(*map(set, everyone)) == set(range(10)) - processed,
          f"remaining indices: {everyone} after processing {sorted(processed)}")


def failure_inside_step(rank: int, size: int, run: SimpleNamespace) -> None:
    """A collective failing inside optimizer.step() (a real mismatch: rank 1's gradients
    carry other scale factors on the first attempt) must leave the optimizer usable for
    the retry; it used to keep the failed reductions pending, and the retry's
    zero_grad() raised for good."""
    torch.manual_seed(20)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    attempts = []

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> int:
        attempts.append(state.step)
        first = len(attempts) == 1
        optimizer._horovodish.reducer.scale = (0.5, 2.0) if first and rank == 1 else (1.0, 1.0)
        for state.step in range(state.step, 3):
            optimizer.zero_grad()
            model(torch.full((2, 3), float(rank + 1))).sum().backward()
            optimizer.step()
            state.commit()
        return state.step

    check(train(state) == 2 and attempts == [0, 0], f"attempts {attempts}")
    # Three plain steps from the same start, as one process over both ranks' batches.
    torch.manual_seed(20)
    reference = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    plain = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(3):
        plain.zero_grad()
        sum(reference(torch.full((2, 3), float(r + 1))).sum() for r in range(size)).div(
            size).backward()
        plain.step()
    for (name, got), want in zip(model.named_parameters(), reference.parameters()):
        close(got, want, f"{name} after the retry", 1e-5, atol=1e-6)


if __name__ == "__main__":
    hvd.init()
    torch.manual_seed(hvd.rank())  # ranks start different: sync() must fix that
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    run = SimpleNamespace(model=model, optimizer=optimizer,
                          state=hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0))
    run_checks([commit_and_restore, run_retries_after_a_failure, kept_in_place,
                failure_inside_step], hvd.rank(), hvd.size(), run)
