"""Module paths that Horovod scripts import from, under the horovodish name."""
from __future__ import annotations


def test_common_exceptions_are_the_adapters_own():
    from horovodish.compat.horovod_paths.common_exceptions import HorovodInternalError, HostsUpdatedInterrupt

    import horovodish.torch as hvd
    assert HorovodInternalError is hvd.HorovodInternalError
    assert HostsUpdatedInterrupt is hvd.HostsUpdatedInterrupt
    assert issubclass(HorovodInternalError, RuntimeError)  # Horovod's base, caught as such
