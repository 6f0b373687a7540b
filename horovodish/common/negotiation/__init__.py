"""Stage 2: every rank agrees on the same ordered responses (controller, coordinator,
response cache, transport)."""
