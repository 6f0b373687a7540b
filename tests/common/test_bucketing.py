"""Gradient buckets (common/bucketing.py): consecutive tensors of one dtype up to a byte
cap, as torch's optimizers and TensorFlow's gradient reduction form them. Pure logic."""
from __future__ import annotations

import random

from horovodish.common.bucketing import consecutive_runs


def runs(items: list[tuple[str, int]], cap: float) -> list[list[tuple[str, int]]]:
    return consecutive_runs(items, lambda item: item[0], lambda item: item[1], cap)


def test_a_dtype_change_or_the_cap_starts_a_new_bucket():
    items = [("f32", 4), ("f32", 4), ("f16", 2), ("f16", 2), ("f32", 8)]
    assert runs(items, 8) == [[("f32", 4), ("f32", 4)], [("f16", 2), ("f16", 2)],
                              [("f32", 8)]]
    assert runs(items, 7) == [[("f32", 4)], [("f32", 4)], [("f16", 2), ("f16", 2)],
                              [("f32", 8)]]  # exactly the cap fits; one byte over does not


def test_a_tensor_over_the_cap_is_a_bucket_of_its_own_and_nothing_is_dropped():
    assert runs([("f32", 100), ("f32", 1), ("f32", 1)], 10) == \
        [[("f32", 100)], [("f32", 1), ("f32", 1)]]
    assert runs([], 10) == []
    assert runs([("f32", 3)] * 4, 0) == [[("f32", 3)]] * 4  # cap 0: one tensor a bucket


def test_random_models_against_a_reference_that_checks_each_cut():
    """Every cut is where the dtype changes or the next tensor would pass the cap, and
    nowhere else; the buckets joined give the tensors back in order."""
    rng = random.Random(5)
    for _ in range(200):
        items = [(rng.choice("ab"), rng.randint(0, 40)) for _ in range(rng.randint(0, 30))]
        cap = rng.randint(0, 60)
        got = runs(items, cap)
        assert [item for bucket in got for item in bucket] == items
        for bucket in got:
            assert len({key for key, _ in bucket}) == 1
            assert len(bucket) == 1 or sum(n for _, n in bucket) <= cap
        for before, after in zip(got, got[1:]):
            first = after[0]
            assert first[0] != before[0][0] or sum(n for _, n in before) + first[1] > cap
