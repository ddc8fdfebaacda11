"""How the operator's process runs Python's cyclic garbage collector.

Why tune it: with 1,000 replicas the operator holds a large, steadily replaced working set (every
watched pod, every sidecar's report, a long poll per replica), and each watch event allocates
thousands of containers while being decoded. Under the interpreter's default thresholds the young
collections promoted so many short-lived objects that a full collection ran every 2 to 3 seconds
in a scale storm at 50 pools x 20 replicas, each holding the event loop for 0.35 to 0.7 seconds
(logged from ``gc.callbacks`` during ``make bench-operator``): most of the delay between a
``kubectl scale`` and the operator's answer. Reference counting frees almost all of that garbage
anyway; the collector is only needed for cycles.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
"""Allocations (less deallocations) between young collections (the interpreter's default is 700):
most of an event's objects are freed before a collection finds them alive and promotes them."""
OLDER_THRESHOLDS = (20, 20)
"""Young collections per middle one, middle ones per full one (defaults 10, 10)."""


def tune() -> None:
    """Collect less often, and never walk what exists at start-up (modules, classes, the generated
    API client's models) again: call once, after the imports and before the event loop starts."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
