"""The settings object of Horovod's Ray executors (``create_settings``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Settings:
    """Horovod's executor settings. What matters here: ``timeout_s`` (the workers'
    start), ``placement_group_timeout_s``, and for ``ElasticRayExecutor`` the elastic
    bounds; no ssh and no interface probe are involved, so the rest is kept as given."""

    nics: set | None = None
    verbose: int = 1
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    timeout_s: int = 300
    placement_group_timeout_s: int = 100
    elastic: bool = False
    min_num_proc: int = 1
    max_num_proc: int | None = None
    reset_limit: int | None = None
    elastic_timeout: float = 600
    # With override_discovery=False: an object whose find_available_hosts_and_slots()
    # gives {node IP: workers} (Horovod's discovery interface); None: Ray's nodes.
    discovery: Any = None
    extra: dict = field(default_factory=dict)
