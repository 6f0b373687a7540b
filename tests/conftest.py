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


def pytest_collection_modifyitems(config, items) -> None:
    """With pytest-xdist (-n 2 --dist loadgroup, as the README runs the suite), the
    multi-host tests stay on one worker: they share one emulated cluster of each kind
    (tests/cluster/conftest.py), built once per worker that runs any of them. They come
    first, so that their worker starts on them while the other takes everything else:
    run last, their several minutes would leave the other worker idle."""
    import pytest
    cluster = TESTS / "cluster"
    on_cluster = [cluster in Path(str(item.fspath)).parents for item in items]
    for item, grouped in zip(items, on_cluster):
        if grouped:
            item.add_marker(pytest.mark.xdist_group("cluster"))
    items[:] = [i for i, g in zip(items, on_cluster) if g] + \
        [i for i, g in zip(items, on_cluster) if not g]
