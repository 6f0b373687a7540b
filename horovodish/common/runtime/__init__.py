"""The runtime thread, the alarm it sleeps on, signal handling and the exit hook (the
entries and handles it hands work through are common/entry.py and common/handles.py,
which every stage below uses)."""
