"""The runtime thread and what it hands work through: entries, handles, the alarm it
sleeps on, signal handling and the exit hook."""
