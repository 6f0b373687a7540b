"""What the Horovod examples runner (horovod_examples.py) relies on: its generated data
is what the scripts' readers accept (checked here without torchvision or Keras, by the
formats' own rules), and its records render one table per torch."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
from PIL import Image

from compat import example_data
from horovodish.bench import render

DIGITS = 1797  # load_digits' count


def read_idx(path: Path) -> np.ndarray:
    """An idx file as torchvision's MNIST reads it: two zero bytes, the type code (0x08,
    unsigned bytes), the number of dimensions, big-endian sizes, then the data."""
    data = path.read_bytes()
    zero, kind, ndim = struct.unpack(">HBB", data[:4])
    assert (zero, kind) == (0, 0x08)
    shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    assert body.size == int(np.prod(shape))
    return body.reshape(shape)


def test_the_mnist_files_are_where_torchvision_looks_in_its_format(tmp_path: Path):
    raw = example_data.write_torchvision_mnist(tmp_path) / "MNIST" / "raw"
    sizes = {}
    for split, (image_file, label_file) in example_data.MNIST_FILES.items():
        images, labels = read_idx(raw / image_file), read_idx(raw / label_file)
        assert images.shape[1:] == (28, 28) and images.shape[0] == labels.shape[0]
        assert labels.ndim == 1 and set(np.unique(labels)) <= set(range(10))
        assert images.max() > 200 and images[:, :2].max() == 0  # ink, and MNIST's border
        sizes[split] = labels.shape[0]
    assert sizes == {"train": DIGITS - example_data.TEST_DIGITS,
                     "test": example_data.TEST_DIGITS}


def test_the_keras_npz_holds_what_load_data_reads(tmp_path: Path):
    path = example_data.write_keras_mnist(tmp_path / ".keras" / "datasets" / "mnist-0.npz")
    with np.load(path, allow_pickle=True) as f:  # as tf_keras' mnist.load_data opens it
        x_train, y_train, x_test, y_test = (f[k] for k in ("x_train", "y_train",
                                                            "x_test", "y_test"))
    assert {a.dtype for a in (x_train, y_train, x_test, y_test)} == {np.dtype(np.uint8)}
    assert x_train.shape == (DIGITS - example_data.TEST_DIGITS, 8, 8)
    assert x_test.shape == (example_data.TEST_DIGITS, 8, 8)
    assert y_train.shape == x_train.shape[:1] and y_test.shape == x_test.shape[:1]


def test_the_image_folder_is_jpegs_one_folder_per_class(tmp_path: Path):
    root = example_data.write_image_folder(tmp_path, classes=3, train_per_class=2,
                                           val_per_class=1, size=32)
    for split, count in (("train", 2), ("val", 1)):
        classes = sorted(p.name for p in (root / split).iterdir())
        assert len(classes) == 3
        for name in classes:
            files = sorted((root / split / name).iterdir())
            assert len(files) == count
            with Image.open(files[0]) as image:
                assert (image.format, image.mode, image.size) == ("JPEG", "RGB", (32, 32))


def test_each_torch_gets_the_table_of_its_newest_run(tmp_path: Path):
    def run(time: str, torch: str, result: str) -> None:
        figures = {"horovod": "0.28.1", "torch": torch, "torchvision": "x",
                   "tensorflow": None, "torchvision_ops_declared": False, "examples": [
                       {"example": "pytorch/pytorch_mnist.py", "args": "--epochs 1",
                        "ranks": 2, "elastic": False, "launcher": True, "result": result,
                        "seconds": 3.0, "exit": 0,
                        "error": "" if result == "passed" else "KeyError: 'a|b'"}]}
        record = {"kind": "horovod-examples", "time": time, "command": "python x.py",
                  "machine": {"cpu": "a CPU", "versions": {"torch": torch}},
                  "figures": figures}
        (tmp_path / f"horovod-examples-{time}.json").write_text(json.dumps(record))
    run("2026-01-01T00:00:00+00:00", "2.13.0+cpu", "failed")
    run("2026-01-02T00:00:00+00:00", "2.0.1", "failed")
    run("2026-01-03T00:00:00+00:00", "2.13.0+cpu", "passed")  # replaces the first
    text = render.render_text("<!-- records:horovod-examples -->\n"
                              "<!-- /records:horovod-examples -->", tmp_path)
    newer, older = text.index("with torch 2.13.0+cpu"), text.index("with torch 2.0.1")
    assert text.count("with torch") == 2 and newer < older
    assert "1 passed, 0 failed" in text[newer:older]
    assert "KeyError: 'a\\|b'" in text[older:]  # a | in a message cannot split the row
