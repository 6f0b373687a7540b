"""Commits on disk (common/elastic_store.py), in one process: every commit reads back
whole, one commit and one spare stay, and the spare's file is the next commit's."""
from __future__ import annotations

import os

import numpy as np

from horovodish.common import elastic_store


def payload(seq: int, count: int) -> dict:
    return {"seq": seq, "weights": np.arange(count, dtype=np.float64) * seq,
            "indices": set(range(seq))}


def test_commits_read_back_and_the_retired_file_is_reused(tmp_path):
    folder = tmp_path / "host"
    inodes = []
    for seq, count in ((1, 5000), (2, 20000), (3, 300), (4, 20000)):
        elastic_store.write(folder, seq, payload(seq, count))
        got = elastic_store.read(folder, seq)
        want = payload(seq, count)
        assert got["seq"] == seq and got["indices"] == want["indices"]
        np.testing.assert_array_equal(got["weights"], want["weights"])
        inodes.append(os.stat(folder / f"commit-{seq:012d}.bin").st_ino)
        names = sorted(os.listdir(folder))
        spare = [".spare"] if seq > 1 else []
        assert names == spare + [f"commit-{seq:012d}.bin"], names
        assert elastic_store.newest(folder) == seq
    # Commit 3 went into commit 1's file (the spare after commit 2), commit 4 into 2's.
    assert inodes[2] == inodes[0] and inodes[3] == inodes[1]


def test_a_spare_from_a_larger_state_is_cut_to_size(tmp_path):
    folder = tmp_path / "host"
    elastic_store.write(folder, 1, payload(1, 100000))
    elastic_store.write(folder, 2, payload(2, 10))
    small = elastic_store.write(folder, 3, payload(3, 10))  # into commit 1's large file
    assert os.path.getsize(folder / "commit-000000000003.bin") == small
    np.testing.assert_array_equal(elastic_store.read(folder, 3)["weights"],
                                  np.arange(10.0) * 3)
