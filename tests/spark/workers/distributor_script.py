"""A horovodish torch script as Spark's TorchDistributor runs it (through torchrun, one
process per barrier task, LOCAL_RANK=0 in each): every rank writes its collectives'
results to OUT_DIR/rank<R>.pickle for the test to check.

    python distributor_script.py OUT_DIR
"""
from __future__ import annotations

import os
import pickle
import sys

import ray_spark_jobs as jobs

result = jobs.collectives()
result["LOCAL_RANK"] = os.environ.get("LOCAL_RANK")
with open(os.path.join(sys.argv[1], f"rank{result['rank']}.pickle"), "wb") as out:
    pickle.dump(result, out)
