"""``python -m horovodish.launcher ...`` behaves exactly like ``horovodishrun ...``."""
import sys

from .run import main

if __name__ == "__main__":
    sys.exit(main())
