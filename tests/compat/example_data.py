"""Data in the formats Horovod's example scripts read, made here from real digits.

No machine here can download MNIST or ImageNet, so the runner (horovod_examples.py)
writes, from scikit-learn's ``load_digits`` (1,797 real 8×8 handwritten digits that ship
with the package):

- torchvision's MNIST raw files (``MNIST/raw/train-images-idx3-ubyte`` and its three
  siblings, idx format, 28×28): with all four present ``datasets.MNIST(download=True)``
  downloads nothing;
- Keras' ``mnist.npz`` (``x_train``, ``y_train``, ``x_test``, ``y_test``, uint8) at 8×8,
  the digits' own size: the Keras scripts fix their step counts in code (up to 6,000
  steps of 128 images a rank) and their models take any image size, so the small image
  keeps each run to minutes on a CPU;
- an ImageFolder tree (``train/<class>/*.JPEG``, ``val/<class>/*.JPEG``) of small JPEGs,
  one colour pattern per class, for the ResNet-50 ImageNet scripts.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

# The digits held out as the test split (of 1,797).
TEST_DIGITS = 297
MNIST_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
               "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
# idx's type code for unsigned bytes (the third byte of the magic number).
_UBYTE = 0x08


def digits() -> tuple[np.ndarray, np.ndarray]:
    """The 8×8 digits as uint8 images in 0..255 and their labels."""
    from sklearn.datasets import load_digits
    data = load_digits()
    images = np.round(data.images * (255 / 16)).astype(np.uint8)
    return images, data.target.astype(np.uint8)


def write_idx(path: Path, array: np.ndarray) -> None:
    """``array`` (uint8) in the idx format: magic, big-endian sizes, then the bytes."""
    header = struct.pack(">BBBB", 0, 0, _UBYTE, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def mnist_size(images: np.ndarray) -> np.ndarray:
    """8×8 images as 28×28 (each pixel 3×3, then a 2-pixel border, as MNIST centres its
    20×20 digits in 28×28): the torch MNIST model's layers need 28×28."""
    big = np.kron(images, np.ones((3, 3), dtype=np.uint8))
    return np.pad(big, ((0, 0), (2, 2), (2, 2)))


def write_torchvision_mnist(root: Path) -> Path:
    """torchvision's MNIST raw files under ``root/MNIST/raw``; returns ``root``."""
    images, labels = digits()
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    splits = {"train": slice(TEST_DIGITS, None), "test": slice(0, TEST_DIGITS)}
    for split, (image_file, label_file) in MNIST_FILES.items():
        write_idx(raw / image_file, mnist_size(images[splits[split]]))
        write_idx(raw / label_file, labels[splits[split]])
    return root


def write_keras_mnist(path: Path) -> Path:
    """Keras' ``mnist.npz`` layout at ``path``, 8×8 images."""
    images, labels = digits()
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x_train=images[TEST_DIGITS:], y_train=labels[TEST_DIGITS:],
             x_test=images[:TEST_DIGITS], y_test=labels[:TEST_DIGITS])
    return path


def write_image_folder(root: Path, classes: int = 2, train_per_class: int = 8,
                       val_per_class: int = 2, size: int = 64) -> Path:
    """An ImageFolder tree of JPEGs under ``root/train`` and ``root/val``; returns ``root``.

    Each class is a stripe pattern of its own colour plus noise, so the classes differ."""
    from PIL import Image
    rng = np.random.default_rng(0)
    for split, count in (("train", train_per_class), ("val", val_per_class)):
        for label in range(classes):
            folder = root / split / f"n{label:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            colour = np.array([(label * 97) % 256, (label * 53 + 80) % 256, 200], np.float32)
            stripes = (np.arange(size) // (4 + 2 * label) % 2)[None, :, None]
            for index in range(count):
                noise = rng.normal(0, 20, (size, size, 3))
                pixels = np.clip(colour * (0.5 + 0.5 * stripes) + noise, 0, 255)
                Image.fromarray(pixels.astype(np.uint8)).save(
                    folder / f"{split}_{label}_{index}.JPEG", quality=90)
    return root
