"""Run Horovod's own parallel suites against horovodish, unchanged, and write a record.

    pip install mock parameterized          # what Horovod's suites import
    python tests/compat/horovod_suites.py --horovod PATH [--record docs/records]
    python -m horovodish.bench.render       # the table in docs/api.md

PATH is a checkout of horovod/horovod (only its ``test/`` folder is read). Each suite
runs under ``horovodishrun`` with the ``horovod`` alias on PYTHONPATH (docs/api.md,
"Migrating from Horovod"), at the ranks given below, with a time limit; pytest's summary
gives the counts and the failed tests' names. A suite that reaches its time limit is
recorded as hung. Not a pytest module (its name does not start with ``test_``): it needs
Horovod's sources, which no test machine has.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from horovodish.bench import records
from horovodish.compat import alias_path

HERE = Path(__file__).resolve()

KERAS_3, TF_KERAS = "Keras 3", "tf_keras"
# (suite under test/, ranks, seconds allowed, the Keras its TensorFlow runs with). The
# Keras suites are Keras 2 code: they run under tf_keras (TF_USE_LEGACY_KERAS=1), as
# their users' scripts would, and under Keras 3.
SUITES = [
    ("parallel/test_torch.py", 2, 600, KERAS_3),
    ("parallel/test_tensorflow.py", 2, 1200, KERAS_3),
    ("parallel/test_tensorflow.py", 2, 1200, TF_KERAS),
    ("parallel/test_tensorflow_process_sets.py", 3, 900, KERAS_3),
    ("parallel/test_process_sets_static.py", 3, 300, KERAS_3),
    ("parallel/test_process_sets_multi_comm.py", 3, 300, KERAS_3),
    ("parallel/test_tensorflow_process_sets_dynamic.py", 2, 300, KERAS_3),
    ("parallel/test_tensorflow2_keras.py", 2, 600, KERAS_3),
    ("parallel/test_tensorflow2_keras.py", 2, 600, TF_KERAS),
    ("parallel/test_tensorflow2_keras_process_sets.py", 3, 600, TF_KERAS),
    ("parallel/test_adasum_pytorch.py", 2, 300, KERAS_3),
    ("parallel/test_adasum_tensorflow.py", 2, 300, KERAS_3),
    ("parallel/test_timeline.py", 2, 300, KERAS_3),
    ("parallel/test_common.py", 2, 300, KERAS_3),
]

_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?)")
# pytest's -rfE lines (SUBFAILED for a unittest subtest), wherever the ranks' merged
# output put them.
_FAILED = re.compile(r"(?:SUB)?(?:FAILED|ERROR)(?:\[[^\]]*\])? (\S+::\S+)")


def run_suite(horovod: Path, suite: str, ranks: int, limit: int, keras: str) -> dict:
    test = horovod / "test"
    env = dict(os.environ)
    env.pop("TF_USE_LEGACY_KERAS", None)
    if keras == TF_KERAS:
        env["TF_USE_LEGACY_KERAS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        [alias_path(), str(test), str(test / "utils"), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "horovodish.launcher", "-np", str(ranks),
               sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
               suite.split("/")[-1]]
    start = time.monotonic()
    try:
        done = subprocess.run(command, cwd=test / suite.split("/")[0], env=env,
                              capture_output=True, text=True, timeout=limit)
        out, hung = done.stdout + done.stderr, False
    except subprocess.TimeoutExpired as exc:
        out, hung = (exc.stdout or b"").decode() + (exc.stderr or b"").decode(), True
    summary = next((line for line in out.splitlines()[::-1]
                    if re.search(r"\d+ (passed|failed)", line)), "")
    counts = {kind.rstrip("s"): int(n) for n, kind in _COUNT.findall(summary)}
    failures = sorted({name.split("::")[-1] for name in _FAILED.findall(out)})
    return {"suite": suite, "ranks": ranks, "keras": keras, "passed": counts.get("passed", 0),
            "failed": counts.get("failed", 0) + counts.get("error", 0),
            "skipped": counts.get("skipped", 0), "hung": hung,
            "seconds": round(time.monotonic() - start, 1), "failures": failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horovod", required=True, type=Path,
                        help="a checkout of horovod/horovod")
    parser.add_argument("--record", default=str(HERE.parents[2] / "docs" / "records"))
    parser.add_argument("--suites", help="comma-separated suite names to run (default all)")
    args = parser.parse_args()
    chosen = set(args.suites.split(",")) if args.suites else None
    results = []
    for suite, ranks, limit, keras in SUITES:
        if chosen and suite.split("/")[-1] not in chosen and suite not in chosen:
            continue
        result = run_suite(args.horovod, suite, ranks, limit, keras)
        print(f"{suite} on {ranks} ranks ({keras}): {result['passed']} passed, "
              f"{result['failed']} "
              f"failed, {result['skipped']} skipped{' (HUNG)' if result['hung'] else ''}, "
              f"{result['seconds']:.0f} s", flush=True)
        results.append(result)
    version = re.search(r"__version__ = '([^']+)'",
                        (args.horovod / "horovod" / "__init__.py").read_text())
    figures = {"horovod": version.group(1) if version else "unknown", "suites": results}
    command = "python tests/compat/horovod_suites.py --horovod PATH"
    print(f"record: {records.write(args.record, 'horovod-suites', figures, command)}")


if __name__ == "__main__":
    main()
