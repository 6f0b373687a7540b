"""The gradient-ready hook on both of its mechanisms, in one process: torch 2.1's
post-accumulate hook and the gradient-accumulator hook torch 2.0 needs (forced here on
today's torch). Each must fire once per backward per parameter, after ``.grad`` holds the
accumulated gradient (checked against autograd's own), and never after ``remove()``."""
from __future__ import annotations

import gc

import pytest
import torch

from horovodish.torch import grad_ready


@pytest.mark.parametrize("post_accumulate", [True, False])
def test_fires_once_per_backward_after_accumulation(monkeypatch, post_accumulate):
    if post_accumulate and not grad_ready.HAS_POST_ACCUMULATE_HOOK:
        pytest.skip(f"torch {torch.__version__} has no post-accumulate hook")
    monkeypatch.setattr(grad_ready, "HAS_POST_ACCUMULATE_HOOK", post_accumulate)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    handles = [grad_ready.register_grad_ready_hook(
        p, lambda param: seen.append((param, param.grad.clone()))) for p in model.parameters()]
    gc.collect()  # the accumulator must outlive any temporary that found it
    x = torch.randn(5, 3)
    for step in range(2):  # the second pass accumulates onto the first
        model(x).pow(2).sum().backward()
        want = torch.autograd.grad(model(x).pow(2).sum(), list(model.parameters()))
        assert len(seen) == 4, f"pass {step}: {len(seen)} hook calls for 4 parameters"
        by_param = {id(p): g for p, g in seen}
        for param, grad in zip(model.parameters(), want):
            torch.testing.assert_close(by_param[id(param)], grad * (step + 1))
        seen.clear()
    for handle in handles:
        handle.remove()
    model(x).sum().backward()
    assert not seen, "a removed hook fired"
