"""tests/ is importable (multirank, worker_support) from every test module, through
pytest.ini's ``pythonpath``, and from every process a test starts, through PYTHONPATH set
here: no test or worker edits sys.path."""
import os
from pathlib import Path

TESTS = str(Path(__file__).parent)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [TESTS, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])
