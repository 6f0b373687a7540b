"""What a TorchState commit copies (elastic._refresh), in one process: a restore point
must never share anything the training loop mutates afterwards."""
from __future__ import annotations

import torch

from horovodish.torch.elastic import _refresh


class Box:
    """Hashable yet mutable: a set of these must be deep-copied."""

    def __init__(self, value: int) -> None:
        self.value = value


def test_a_set_of_indices_is_copied_not_shared():
    indices = set(range(0, 1000, 3))
    saved = _refresh(None, {"epoch": 2, "processed_indices": indices})
    indices.add(1)  # the sampler goes on recording
    assert saved["processed_indices"] == set(range(0, 1000, 3))
    assert saved["epoch"] == 2


def test_a_set_of_mutable_objects_is_deep_copied():
    box = Box(1)
    saved = _refresh(None, {box})
    box.value = 2
    (copied,) = saved
    assert copied is not box and copied.value == 1


def test_tensors_are_copied_into_the_previous_restore_point():
    weight = torch.arange(4.0)
    first = _refresh(None, {"w": weight})
    weight += 10
    second = _refresh(first, {"w": weight})
    assert second["w"].data_ptr() == first["w"].data_ptr()  # reused, no new memory
    assert torch.equal(second["w"], torch.arange(4.0) + 10)
    weight += 1
    assert torch.equal(second["w"], torch.arange(4.0) + 10)


def test_a_sampler_restore_point_is_its_own():
    """The sampler's state is saved without a second copy; what training records
    afterwards must not leak into the restore point."""
    from horovodish.torch.elastic import ElasticSampler, _Sampler

    sampler = ElasticSampler(list(range(100)), shuffle=False)
    sampler.processed_indices.update({1, 2, 3})
    kept = _Sampler(sampler)  # saves at once
    sampler.processed_indices.add(50)
    sampler.epoch = 7
    assert kept._saved == {"epoch": 0, "processed_indices": {1, 2, 3}}
    kept.restore()
    assert sampler.processed_indices == {1, 2, 3} and sampler.epoch == 0
