"""Run a Horovod script unchanged: ``import horovod.torch`` gives ``horovodish.torch``.

Put :func:`alias_path` on ``PYTHONPATH`` (``export PYTHONPATH=$(python -m horovodish.compat)``)
and every ``horovod.X`` module a script imports is the ``horovodish.X`` module itself (the
same object, not a copy), so ``horovod.torch.allreduce is horovodish.torch.allreduce``.
The alias lives in a directory of its own so that nothing else lands on the path.

Job files written for Horovod call ``horovodrun``: put :func:`launcher_path` on ``PATH``
(``export PATH=$(python -m horovodish.compat --bin):$PATH``) and ``horovodrun`` is
``horovodishrun``. Both are opt-in, so neither shadows a real Horovod install.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

_LAUNCHER = """#!{python}
# Horovod's launcher name for horovodishrun (python -m horovodish.compat --bin).
import sys
from horovodish.launcher.run import main
sys.exit(main())
"""


def alias_path() -> str:
    """The directory that holds the ``horovod`` alias package."""
    return str(Path(__file__).resolve().parent / "alias")


def launcher_path() -> str:
    """A directory holding ``horovodrun``, which runs horovodishrun with this Python.

    Written on each call (the interpreter's path is in its first line): next to the
    alias when the installation is writable, else in a per-user directory."""
    text = _LAUNCHER.format(python=sys.executable)
    for directory in (Path(__file__).resolve().parent / "bin",
                      Path(tempfile.gettempdir()) / f"horovodish-bin-{os.getuid()}"):
        script = directory / "horovodrun"
        try:
            directory.mkdir(exist_ok=True)
            if not script.is_file() or script.read_text() != text:
                script.write_text(text)
            script.chmod(0o755)
            return str(directory)
        except OSError:
            continue
    raise OSError("python -m horovodish.compat --bin: no writable directory for horovodrun")
