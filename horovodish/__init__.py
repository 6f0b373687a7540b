"""horovodish: a Horovod-style allreduce runtime for PyTorch, TensorFlow/Keras 3 and JAX.

Import the adapter for your framework (``import horovodish.torch as hvd`` or
``import horovodish.tensorflow as hvd``); this top-level package only carries the version,
and, under a launcher that is not MPI's own (torchrun, a plain srun, Ray, Spark), keeps
mpi4py from starting MPI before ``init()`` has joined this process to the job's world
(``common/world``).
"""
import os as _os

from .common.world.mpi_start import defer_import_start as _defer_import_start

__version__ = "0.1.0"

_defer_import_start(_os.environ)


def __getattr__(name: str):  # noqa: ANN202 - the module's lazy attributes
    """``horovodish.run`` (Horovod's ``horovod.run``), imported when first used."""
    if name == "run":
        from .launcher.function_job import run
        return run
    raise AttributeError(f"module 'horovodish' has no attribute {name!r}")
