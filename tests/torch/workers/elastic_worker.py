"""hvd.elastic: TorchState commit/restore/sync round trips, and run() retrying after a
HorovodInternalError from a deliberate mismatch on the first attempt."""
from __future__ import annotations

import sys

import torch

import horovodish.torch as hvd


def main() -> None:
    hvd.init()
    rank = hvd.rank()
    torch.manual_seed(rank)  # ranks start different: sync() must fix that
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)

    # commit / restore round trip, locally
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
    assert all(torch.equal(model.state_dict()[k], v) for k, v in committed.items())
    assert torch.equal(optimizer.state_dict()["state"][0]["momentum_buffer"], momentum)
    assert (state.epoch, state.batch) == (3, 0)

    attempts = []

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> int:
        attempts.append(state.epoch)
        # after sync every rank holds rank 0's weights
        weights = hvd.allgather_object(model.weight.detach().clone())
        assert all(torch.equal(w, weights[0]) for w in weights), "sync did not align ranks"
        if len(attempts) == 1:
            state.epoch = 99  # progress that is lost with the failure
            # a mismatch on purpose: HorovodInternalError on every rank
            hvd.allreduce(torch.ones(2 + rank), name="elastic.mismatch")
        return state.epoch

    result = train(state)
    assert len(attempts) == 2, attempts
    assert result == 3 and attempts == [3, 3], (result, attempts)  # restored from the commit
    assert hvd.is_initialized()
    sys.stdout.write(f"OK rank {rank}\n")


if __name__ == "__main__":
    main()
