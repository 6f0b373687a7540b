"""horovodish: a Horovod-style allreduce runtime for PyTorch and TensorFlow/Keras 3.

Import the adapter for your framework (``import horovodish.torch as hvd`` or
``import horovodish.tensorflow as hvd``); this top-level package only carries the version.
"""

__version__ = "0.1.0"
