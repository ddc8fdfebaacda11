"""Integer milli-units: the arithmetic HPA's replica calculator decides in.

HPA never divides floats to pick a replica count that matters: every metric value and
target is a milli-value (``int64``), the average is the total divided by the pod count in
integers, and only the final ratio is compared with the tolerance. Doing the same here
keeps a demand of exactly N targets at N replicas (65 requests over 3 replicas at target 5
is 13, where ``ceil(65 / 3 / 5 * 3)`` in floats is 14) and makes every count reproducible
from the numbers recorded in status.

Two conversions enter this world, and they round differently on purpose:

* spec quantities (targets, tolerances, thresholds) are exact decimals, read the way
  Kubernetes' ``Quantity.MilliValue()`` reads them: rounded up to a whole milli-unit;
* observed values are floats, from exposition text or PromQL arithmetic. Converting a
  float to a quantity is a metrics adapter's job in HPA's pipeline; here it rounds to the
  nearest milli-unit, so float noise (``0.1 + 0.2`` is ``0.30000000000000004``) never
  reads as one milli-unit more and pushes an exact demand over a whole replica.
"""

from __future__ import annotations

import math
from fractions import Fraction

MILLI = 1000


def quantity_milli(quantity: str) -> int:
    """A :data:`~genrm_operator.api.autoscaling.Quantity` string in milli-units, rounded up.

    ``"850m"`` and ``"0.85"`` are both 850; digits below a milli-unit round up, as
    ``MilliValue()`` does, so a target is never read smaller than written.
    """
    if quantity.endswith("m"):
        return math.ceil(Fraction(quantity[:-1]))
    return math.ceil(Fraction(quantity) * MILLI)


def sample_milli(value: float) -> int:
    """An observed (finite) value in milli-units, rounded to the nearest one (halves up)."""
    return math.floor(Fraction(value) * MILLI + Fraction(1, 2))


def ceil_div(numerator: int, denominator: int) -> int:
    """``ceil(numerator / denominator)`` without leaving the integers (``denominator > 0``)."""
    return -(-numerator // denominator)
