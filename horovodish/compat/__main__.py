"""``python -m horovodish.compat`` prints the directory to put on ``PYTHONPATH``."""
from horovodish.compat import alias_path

print(alias_path())
