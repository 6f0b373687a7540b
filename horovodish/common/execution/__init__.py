"""Stage 3: fusion and the backends that run a negotiated group (executor, fusion
planning and buffers, operation manager, backends)."""
