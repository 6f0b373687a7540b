"""The ``horovod`` alias: every ``horovod.X`` import resolves to ``horovodish.X``.

An import hook rather than a tree of forwarding modules, so that each ``horovod.X`` is the
very module object ``horovodish.X`` (its globals, patches and ``isinstance`` checks are
shared) and a new horovodish module needs no twin here. Horovod's ``horovod.runner`` is
our launcher package.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType

_RENAMED = {"horovod.runner": "horovodish.launcher"}


def _target(fullname: str) -> str:
    for old, new in _RENAMED.items():
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
