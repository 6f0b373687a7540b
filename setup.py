"""Packaging for horovodish: pure Python, no compiler needed."""
from setuptools import find_packages, setup

TORCH = ["torch>=2.0"]  # 2.0.1 is the newest torch Horovod builds against
TENSORFLOW = ["tensorflow-cpu>=2.16", "keras>=3.0"]
# Keras 2 for scripts written for it: TF_USE_LEGACY_KERAS=1 (docs/tensorflow.md)
TF_KERAS = ["tf_keras>=2.16"]
MPICH = ["mpich>=4.1"]
JAX = ["jax>=0.4.30", "optax>=0.2"]
RAY = ["ray[train]>=2.50"]
SPARK = ["pyspark>=3.5"]  # and a Java runtime (17) for its JVM
# The NCCL path for CUDA tensors (docs/gpu.md): CuPy, and the NCCL wheel CuPy loads.
CUDA12 = ["cupy-cuda12x>=13", "nvidia-nccl-cu12"]
CUDA13 = ["cupy-cuda13x>=14", "nvidia-nccl-cu13"]

setup(
    name="horovodish",
    version="0.1.0",
    description="Horovod-style allreduce runtime for PyTorch, TensorFlow/Keras 3 and JAX",
    python_requires=">=3.10",
    packages=find_packages(include=["horovodish", "horovodish.*"]) + ["horovodish.launcher"],
    package_dir={"horovodish.launcher": "launcher"},
    # The `horovod` alias package sits in a plain directory, not a subpackage (see
    # horovodish/compat): shipped as data.
    package_data={"horovodish.compat": ["alias/horovod/*.py"]},
    install_requires=["numpy>=1.24", "mpi4py>=4.0", "ml_dtypes>=0.3", "cloudpickle>=2.0"],
    extras_require={
        "torch": TORCH,
        "tensorflow": TENSORFLOW,
        "tf_keras": TF_KERAS,
        "jax": JAX,
        "ray": RAY,
        "spark": SPARK,
        "cuda12": CUDA12,
        "cuda13": CUDA13,
        "cupy": CUDA12,  # the older name of cuda12
        "mpich": MPICH,
        # Everything a CPU-only test machine needs; torch pinned by version (for the CPU
        # build, an index or wheel that serves it: see docs/install.md).
        "dev": ["torch==2.13.0", *TENSORFLOW, *TF_KERAS, *JAX, *MPICH, "ray[train]==2.60.0",
                "pyspark==4.3.0", "pytest>=7", "pytest-timeout", "scikit-learn",
                "matplotlib"],
    },
    entry_points={"console_scripts": [
        "horovodishrun=horovodish.launcher.run:main",
        "horovodish-slurm-hosts=horovodish.launcher.slurm_discovery:main"]},
)
