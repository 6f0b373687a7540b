"""Framework-neutral core: configuration, negotiation, fusion, backends and the runtime thread."""
