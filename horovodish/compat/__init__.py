"""Run a Horovod script unchanged: ``import horovod.torch`` gives ``horovodish.torch``.

Put :func:`alias_path` on ``PYTHONPATH`` (``export PYTHONPATH=$(python -m horovodish.compat)``)
and every ``horovod.X`` module a script imports is the ``horovodish.X`` module itself (the
same object, not a copy), so ``horovod.torch.allreduce is horovodish.torch.allreduce``.
The alias lives in a directory of its own so that nothing else lands on the path.
"""
from __future__ import annotations

from pathlib import Path


def alias_path() -> str:
    """The directory that holds the ``horovod`` alias package."""
    return str(Path(__file__).resolve().parent / "alias")
