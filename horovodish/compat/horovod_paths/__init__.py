"""Modules that exist only so that Horovod's import paths resolve: what Horovod's
scripts and test suites import from ``horovod.common.util``, ``horovod.common.basics``,
``horovod.common.exceptions``, ``horovod.tensorflow.util``,
``horovod.runner.util.threads`` and ``horovod.runner.common.util.env``. The alias
(horovodish/compat/alias) maps each of those paths here; nothing outside compat/ is a
stand-in of this kind. The adapters re-export the few helpers Horovod's ``hvd``
namespaces had (``hvd.check_extension``, ``hvd.mpi_ops._basics``, ...) from here."""
