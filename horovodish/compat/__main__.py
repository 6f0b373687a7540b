"""``python -m horovodish.compat`` prints the directory to put on ``PYTHONPATH``;
``python -m horovodish.compat --bin`` the directory to put on ``PATH`` for Horovod's
launcher name, ``horovodrun``."""
import sys

from horovodish.compat import alias_path, launcher_path

print(launcher_path() if sys.argv[1:] == ["--bin"] else alias_path())
