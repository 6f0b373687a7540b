"""horovodish on Ray (``pip install horovodish[ray]``): Horovod's ``RayExecutor`` and
``ElasticRayExecutor``, and ``HorovodishConfig``, a Ray Train backend. A job's PMI
server runs in the driver (``horovodish.common.world.driver_world``); docs/ray.md."""
from .elastic import ElasticRayExecutor
from .executor import RayExecutor
from .settings import Settings
from .train_backend import HorovodishBackend, HorovodishConfig
from .worker import BaseHorovodWorker

__all__ = ["BaseHorovodWorker", "ElasticRayExecutor", "HorovodishBackend",
           "HorovodishConfig", "RayExecutor", "Settings"]
