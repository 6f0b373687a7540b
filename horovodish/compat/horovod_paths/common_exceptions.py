"""Horovod import path (a shim; the errors live in errors.py):
``from horovodish.common.exceptions import HorovodInternalError``, the module path of
Horovod's ``horovod.common.exceptions``, which elastic scripts import from."""
from ...common.errors import HorovodInternalError, HostsUpdatedInterrupt

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt"]
