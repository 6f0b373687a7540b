"""Horovod's ``horovod.runner`` path (see horovod_paths)."""
