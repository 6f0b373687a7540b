"""The ``horovod`` alias: every ``horovod.X`` import resolves to ``horovodish.X``.

An import hook rather than a tree of forwarding modules, so that each ``horovod.X`` is the
very module object ``horovodish.X`` (its globals, patches and ``isinstance`` checks are
shared) and a new horovodish module needs no twin here. Horovod's ``horovod.runner`` is
our launcher package; the few paths that exist only for Horovod's sake map to
horovodish/compat/horovod_paths.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType

_PATHS = "horovodish.compat.horovod_paths"
# Horovod's paths whose modules are not horovodish.X: the launcher package, and the
# stand-ins that exist only for Horovod's paths (horovodish/compat/horovod_paths).
_RENAMED = {"horovod.runner.util": f"{_PATHS}.runner.util",
            "horovod.runner.common": f"{_PATHS}.runner.common",
            "horovod.runner": "horovodish.launcher",
            "horovod.common.util": f"{_PATHS}.common_util",
            "horovod.common.basics": f"{_PATHS}.common_basics",
            "horovod.common.exceptions": f"{_PATHS}.common_exceptions",
            "horovod.tensorflow.util": f"{_PATHS}.tensorflow_util"}


def _target(fullname: str) -> str:
    """The module behind ``fullname``: the longest renamed prefix wins."""
    for old, new in sorted(_RENAMED.items(), key=lambda item: -len(item[0])):
        if fullname == old or fullname.startswith(old + "."):
            return new + fullname[len(old):]
    return "horovodish" + fullname[len("horovod"):]


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self._target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self._target)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the target module ran when it was imported."""


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("horovod."):
            return None
        name = _target(fullname)
        if importlib.util.find_spec(name) is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(name))


if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())

import horovodish as _horovodish  # noqa: E402

__version__ = _horovodish.__version__


def __getattr__(name: str):  # noqa: ANN202
    """``horovod.run``: horovodish.run."""
    return getattr(_horovodish, name)
