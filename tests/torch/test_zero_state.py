"""zero_state in one process: shards cut out of a plain optimizer's state dict and
consolidated back give that state dict again, for any number of ranks, and states a
sharded optimizer cannot hold are refused with the parameter named."""
from __future__ import annotations

import pytest
import torch

from horovodish.torch.zero_state import SHARDED_KEY, bucket_layout, consolidate, shard_of


def plain_state() -> tuple[dict, list[torch.Size]]:
    """A stepped Adam over 3 parameters of 7, 3x5 and 4 values: torch's state dict."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*s)) for s in ((7,), (3, 5), (4,))]
    opt = torch.optim.Adam(params, lr=0.1)
    for _ in range(2):
        for p in params:
            p.grad = torch.randn_like(p)
        opt.step()
    return opt.state_dict(), [p.shape for p in params]


def sharded(full: dict, shapes: list[torch.Size], size: int) -> list[dict]:
    """What each of size ranks holds: one bucket of all three parameters, split as the
    reducescatter splits it (the first total % size ranks one more)."""
    total = sum(s.numel() for s in shapes)
    base, extra = divmod(total, size)
    counts = [base + (r < extra) for r in range(size)]
    dicts = []
    for rank in range(size):
        layout = bucket_layout([0, 1, 2], shapes, sum(counts[:rank]), counts[rank])
        piece = shard_of(full, layout, ["a", "b", "c"])
        dicts.append({"state": {0: piece} if counts[rank] else {},
                      "param_groups": full["param_groups"],
                      SHARDED_KEY: {"world_size": size, "rank": rank, "stage": 2,
                                    "buckets": [layout]}})
    return dicts


@pytest.mark.parametrize("size", [1, 2, 3, 4, 40])
def test_shards_consolidate_back(size):
    full, shapes = plain_state()
    pieces = sharded(full, shapes, size)
    for rank, piece in enumerate(pieces):  # elementwise state: the rank's range only
        if piece["state"]:
            layout = piece[SHARDED_KEY]["buckets"][0]
            assert piece["state"][0]["exp_avg"].shape == (layout["count"],)
            assert piece["state"][0]["step"].dim() == 0
    again = consolidate(list(reversed(pieces)))
    assert again["param_groups"] == full["param_groups"]
    assert sorted(again["state"]) == sorted(full["state"])
    for index, entries in full["state"].items():
        for key, value in entries.items():
            assert torch.equal(again["state"][index][key], value), (index, key)
            assert again["state"][index][key] is not value  # each its own copy
    steps = [again["state"][i]["step"] for i in again["state"]]
    assert len({id(s) for s in steps}) == len(steps)  # a plain Adam steps each in place


def test_refused_states():
    full, shapes = plain_state()
    layout = bucket_layout([0, 1, 2], shapes, 0, 26)
    uneven = {"state": {0: full["state"][0], 1: full["state"][1]},
              "param_groups": full["param_groups"]}
    with pytest.raises(ValueError, match=r"\['c'\] have no optimizer state"):
        shard_of(uneven, layout, ["a", "b", "c"])
    steps = {"state": {i: dict(e, step=torch.tensor(float(i))) for i, e in
                       full["state"].items()}, "param_groups": full["param_groups"]}
    with pytest.raises(ValueError, match="differs between parameters"):
        shard_of(steps, layout, ["a", "b", "c"])
    shaped = {"state": {i: dict(e) for i, e in full["state"].items()},
              "param_groups": full["param_groups"]}
    shaped["state"][1]["exp_avg"] = shaped["state"][1]["exp_avg"].reshape(5, 3)
    with pytest.raises(ValueError, match=r"'exp_avg' of parameter 'b' has shape \[5, 3\]"):
        shard_of(shaped, layout, ["a", "b", "c"])
    with pytest.raises(ValueError, match="ranks 0..2"):
        consolidate(sharded(full, shapes, 3)[:2])
