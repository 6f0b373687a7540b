"""``python -m horovodish.bench``: see the package docstring."""
from . import main

main()
