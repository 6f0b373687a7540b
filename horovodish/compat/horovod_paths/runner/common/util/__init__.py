"""Horovod's ``horovod.runner.common.util`` path (see horovod_paths)."""
