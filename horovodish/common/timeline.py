"""Timeline: a Chrome-trace JSON file from rank 0, one row per tensor.

Rows show NEGOTIATE_<OP> (with an instant mark as each rank reports ready), then the op
with nested phases: QUEUE (ready, waiting behind earlier groups), MEMCPY_IN_FUSION_BUFFER,
the collective named after its backend (e.g. RING_ALLREDUCE), MEMCPY_OUT_FUSION_BUFFER.
The file ends in ']' after every flush, so it parses while training runs (Perfetto,
chrome://tracing). Events are buffered and written at most every flush interval.
"""
from __future__ import annotations

import json
import os
import threading
import time

_FLUSH_INTERVAL = 0.2


def _now_us() -> float:
    return time.perf_counter() * 1e6


class Timeline:
    def __init__(self, path: str, mark_cycles: bool = False) -> None:
        self.path = path
        self.mark_cycles = mark_cycles
        self._rows: dict[str, int] = {}
        self._events: list[str] = []
        self._lock = threading.Lock()
        self._closed = False
        self._last_flush = 0.0
        self._negotiating: set[str] = set()
        self._file = open(path, "w+b")
        self._file.write(b"[\n")
        self._empty = True
        self._emit({"name": "process_name", "ph": "M", "pid": 0,
                    "args": {"name": "horovodish rank 0"}})
        self.flush(force=True)

    # -- events --------------------------------------------------------------------------
    def _emit(self, event: dict) -> None:
        self._events.append(json.dumps(event, separators=(",", ":")))

    def _row(self, name: str) -> int:
        row = self._rows.get(name)
        if row is None:
            row = self._rows[name] = len(self._rows) + 1
            self._emit({"name": "thread_name", "ph": "M", "pid": 0, "tid": row,
                        "args": {"name": name}})
        return row

    def _span(self, ph: str, name: str, phase: str, ts: float | None = None,
              args: dict | None = None) -> None:
        event = {"name": phase, "ph": ph, "pid": 0, "tid": self._row(name),
                 "ts": _now_us() if ts is None else ts}
        if args:
            event["args"] = args
        self._emit(event)

    def negotiate_start(self, name: str, opname: str) -> None:
        if name not in self._negotiating:
            self._negotiating.add(name)
            self._span("B", name, f"NEGOTIATE_{opname.upper()}")

    def rank_ready(self, name: str, rank: int) -> None:
        self._emit({"name": str(rank), "ph": "i", "s": "t", "pid": 0, "tid": self._row(name),
                    "ts": _now_us()})

    def negotiate_end(self, name: str) -> None:
        if name in self._negotiating:
            self._negotiating.discard(name)
            self._span("E", name, "")

    def begin(self, names: list[str], phase: str, ts: float | None = None,
              args: dict | None = None) -> None:
        for name in names:
            self._span("B", name, phase, ts, args)

    def end(self, names: list[str], ts: float | None = None) -> None:
        for name in names:
            self._span("E", name, "", ts)

    def cycle(self) -> None:
        if self.mark_cycles:
            self._emit({"name": "CYCLE_START", "ph": "i", "s": "g", "pid": 0, "tid": 0,
                        "ts": _now_us()})

    # -- file ----------------------------------------------------------------------------
    def flush(self, force: bool = False) -> None:
        """Append buffered events and re-close the JSON array: one write per flush."""
        now = time.monotonic()
        if not force and (now - self._last_flush < _FLUSH_INTERVAL or not self._events):
            return
        with self._lock:
            if self._closed or not self._events:
                return
            events, self._events = self._events, []
            body = ",\n".join(events)
            prefix = "" if self._empty else ",\n"
            self._empty = False
            self._file.seek(0, os.SEEK_END)
            end = self._file.tell()
            if end > 2:  # step back over the closing "]\n" written last time
                self._file.seek(end - 2)
            self._file.write(f"{prefix}{body}\n]\n".encode())
            self._file.flush()
            self._last_flush = now

    def close(self) -> None:
        self.flush(force=True)
        with self._lock:
            if not self._closed:
                self._closed = True
                self._file.close()
