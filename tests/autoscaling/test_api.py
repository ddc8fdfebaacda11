"""spec.autoscaling and status.autoscaler: defaults, cross-field rules, quantities, wire form."""

from __future__ import annotations

from typing import Any

import pytest
from genrm_operator.api.autoscaling import (
    AutoscalerStatus,
    AutoscalingSpec,
    format_quantity,
    quantity_value,
)
from genrm_operator.api.base import format_time, parse_time
from pydantic import ValidationError

INFLIGHT = {"type": "InFlight", "target": {"averageValue": "8"}}


def test_defaults_are_off_and_gpu_friendly() -> None:
    spec = AutoscalingSpec()
    assert (spec.mode, spec.min_replicas, spec.interval_seconds, spec.fallback.policy) == ("Off", 1, 5, "Hold")
    up, down = spec.behavior.scale_up, spec.behavior.scale_down
    assert (up.stabilization_window_seconds, up.tolerance, up.select_policy) == (0, "0.05", "Max")
    assert (down.stabilization_window_seconds, down.tolerance) == (600, "0.15")
    assert [(p.type, p.value, p.period_seconds) for p in down.policies] == [("Pods", 1, 120), ("Percent", 10, 120)]


def test_partial_direction_keeps_that_directions_defaults() -> None:
    spec = AutoscalingSpec.model_validate({"behavior": {"scaleDown": {"tolerance": "0.2"}}})
    assert spec.behavior.scale_down.stabilization_window_seconds == 600
    assert spec.behavior.scale_up.stabilization_window_seconds == 0


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        ({"mode": "Auto", "metrics": [INFLIGHT]}, "maxReplicas is required"),
        ({"mode": "Auto", "minReplicas": 5, "maxReplicas": 2, "metrics": [INFLIGHT]}, "must not exceed"),
        ({"mode": "Auto", "maxReplicas": 2, "metrics": [{"type": "KVCache", "target": {"averageValue": "0.85"}}]},
         "other than KVCache"),
        ({"metrics": [INFLIGHT, INFLIGHT]}, "unique"),
        ({"metrics": [{"type": "Latency", "target": {"averageValue": "2"}}]}, "quantile is required"),
        ({"metrics": [{"type": "Prometheus", "query": "up", "target": {"type": "Value", "value": "1"}}]},
         "prometheusUrl is required"),
        ({"metrics": [{"type": "Queue", "target": {"type": "Value", "value": "1"}}]}, "AverageValue target"),
        ({"metrics": [{"type": "Queue", "target": {"averageValue": "1", "value": "1"}}]}, "exactly one"),
        ({"fallback": {"policy": "Static"}}, "replicas is required"),
        ({"metrics": [{"type": "Queue", "target": {"averageValue": "0"}}]}, "pattern"),
        ({"metrics": [{"type": "Queue", "target": {"averageValue": 0.5}}]}, "string"),
        ({"mode": "Auto", "maxReplicas": 2, "bogus": 1}, "Extra inputs"),
    ],
)
def test_invalid_specs_are_rejected(wire: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        AutoscalingSpec.model_validate(wire)


def test_cross_field_rules_are_in_the_crd_schema() -> None:
    schema = AutoscalingSpec.model_json_schema(by_alias=True)
    rules = [v["rule"] for v in schema["x-kubernetes-validations"]]
    assert "self.mode == 'Off' || has(self.maxReplicas)" in rules
    assert "x-kubernetes-validations" in schema["$defs"]["MetricSpec"]
    assert "x-kubernetes-validations" in schema["$defs"]["FallbackSpec"]


@pytest.mark.parametrize(("text", "value"), [("4", 4.0), ("0.85", 0.85), ("850m", 0.85), ("1500m", 1.5)])
def test_quantities(text: str, value: float) -> None:
    assert quantity_value(text) == pytest.approx(value)


def test_quantity_formatting_for_status() -> None:
    assert [format_quantity(v) for v in (40.0, 12.5, 0.0, 1 / 3)] == ["40", "12.5", "0", "0.333"]


def test_times_round_trip_with_milliseconds() -> None:
    moment = parse_time("2026-03-01T12:00:01.250Z")
    assert format_time(moment) == "2026-03-01T12:00:01.250Z"
    assert format_time(parse_time("2026-03-01T12:00:00Z")) == "2026-03-01T12:00:00Z"


def test_status_wire_form_is_camel_case_and_round_trips() -> None:
    status = AutoscalerStatus.model_validate(
        {
            "desiredReplicas": 3,
            "consecutiveFailures": 1,
            "recommendations": [{"time": "2026-03-01T12:00:00Z", "replicas": 3}],
            "scaleEvents": [{"time": "2026-03-01T12:00:00Z", "change": 2}],
        }
    )
    assert AutoscalerStatus.model_validate(status.to_wire()) == status
    assert "scaleEvents" in status.to_wire()
