"""tests/ and examples/ are importable from every test module, through pytest.ini's
``pythonpath``, and from every process a test starts, through PYTHONPATH set here: no
test or worker edits sys.path. tests/ holds the harness (multirank, worker_support);
examples/ the runnable scripts whose definitions a worker may reuse (the comm-hooks
worker trains pytorch_digits). A worker script itself is imported by file
(``multirank.import_worker``): worker names repeat across areas."""
import os
from pathlib import Path

TESTS = Path(__file__).parent
PATHS = [str(TESTS), str(TESTS.parent / "examples")]
os.environ["PYTHONPATH"] = os.pathsep.join(
    [*PATHS, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
               if p and p not in PATHS]])

