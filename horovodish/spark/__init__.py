"""horovodish on Spark (``pip install horovodish[spark]``): Horovod's
``horovod.spark.run`` and ``run_elastic``; docs/spark.md. Spark's own
``TorchDistributor`` needs nothing from here: it starts torchrun in each task, and
``hvd.init()`` forms the world under torchrun (docs/launchers.md)."""
from .runner import RankOutcome, SparkJobError, run, run_elastic

__all__ = ["RankOutcome", "SparkJobError", "run", "run_elastic"]
