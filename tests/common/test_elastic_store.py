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


def test_commit_folders_are_the_user_s_alone(tmp_path, monkeypatch):
    """Created 0700; a folder another user owns, or one others can write to, is refused
    with the reason, for writing and for reading alike (a commit is a pickle)."""
    import pytest
    root = tmp_path / "commits"
    monkeypatch.setenv(elastic_store.ENV_DIR, str(root))
    folder = elastic_store.directory()
    elastic_store.write(folder, 1, payload(1, 10))
    for path in (root, folder):
        assert os.stat(path).st_mode & 0o777 == 0o700, oct(os.stat(path).st_mode)
    os.chmod(root, 0o777)
    with pytest.raises(PermissionError, match=r"others can write to .*commits.*chmod go-w"):
        elastic_store.newest(folder)
    with pytest.raises(PermissionError, match="others can write to"):
        elastic_store.write(folder, 2, payload(2, 10))
    os.chmod(root, 0o700)
    if os.geteuid() == 0:  # only root can give a folder away
        os.chown(folder, 12345, -1)
        with pytest.raises(PermissionError, match="belongs to user id 12345"):
            elastic_store.read(folder, 1)
        os.chown(folder, 0, -1)
    assert elastic_store.read(folder, 1)["seq"] == 1


def test_under_torchrun_commits_are_found_by_the_run_id(tmp_path, monkeypatch):
    monkeypatch.delenv(elastic_store.ENV_DIR, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run/7")
    monkeypatch.setattr(elastic_store.tempfile, "gettempdir", lambda: str(tmp_path))
    folder = elastic_store.directory()
    assert folder.parent == tmp_path / f"horovodish-elastic-{os.geteuid()}" / "run_7"
    assert elastic_store.is_job_owned(folder)
    elastic_store.write(folder, 3, payload(3, 10))
    assert elastic_store.newest(elastic_store.directory()) == 3
