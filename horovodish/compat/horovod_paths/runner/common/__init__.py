"""Horovod's ``horovod.runner.common`` path (see horovod_paths)."""
