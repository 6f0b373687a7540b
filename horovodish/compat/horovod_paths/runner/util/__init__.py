"""Horovod's ``horovod.runner.util`` path (see horovod_paths)."""
