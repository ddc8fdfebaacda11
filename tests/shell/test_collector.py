"""``genrm_operator.shell.collector.tune``: collect less often, never re-walk what start-up made.

Aspects under test: the thresholds are set; what exists at the call is moved out of every later
collection (frozen); objects made after it are still collected.
"""

from __future__ import annotations

import gc

from genrm_operator.shell import collector


def test_start_up_objects_are_frozen_and_later_cycles_still_collected() -> None:
    before = gc.get_threshold()
    try:
        collector.tune()
        assert gc.get_threshold() == (collector.YOUNG_THRESHOLD, *collector.OLDER_THRESHOLDS)
        assert gc.get_freeze_count() > 1000
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
