"""How the operator's process runs Python's cyclic garbage collector.

Why tune it: with 1,000 replicas the operator holds a large, steadily replaced working set (every
watched pod, every sidecar's report, a long poll per replica), and each watch event allocates
thousands of containers while being decoded. Under the interpreter's default thresholds the young
collections promoted so many short-lived objects that full collections ran every few seconds in a
scale storm, each holding the event loop long enough to be most of the delay between a ``kubectl
scale`` and the operator's answer (logged from ``gc.callbacks`` during ``make bench-operator``).
Reference counting frees almost all of that garbage anyway; the collector is only needed for
cycles, and the ones left are kopf's: each watch event's ``Body`` and ``Patch`` point at their own
views, so every event's decoded object waits for a young collection (httpx responses did the same
until sidecar calls moved to aiohttp).

The thresholds below were chosen by measuring the pauses in that storm at the default, a larger
and this young threshold (figures: docs/performance.md#measurements-behind-the-code).
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000
"""Allocations (less deallocations) between young collections (the interpreter's default is 700):
most of an event's objects are freed before a collection finds them alive and promotes them, and
a young collection stays short."""
OLDER_THRESHOLDS = (20, 20)
"""Young collections per middle one, middle ones per full one (defaults 10, 10)."""


def tune() -> None:
    """Collect less often, and never walk what exists at start-up (modules, classes, the generated
    API client's models) again: call once, after the imports and before the event loop starts."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
