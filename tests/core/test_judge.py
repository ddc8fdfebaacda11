"""The judge revision (`core.judge`): it changes with what the judge answers and with nothing else,
and every replica pod carries it where the engine, the gateway and Prometheus read it."""

from __future__ import annotations

import re
from typing import Any

import pytest
from genrm_contract.sidecar import JUDGE_REVISION_FLAG, JUDGE_REVISION_PATTERN
from genrm_operator.api.pool import GenRMPoolSpec
from genrm_operator.core import children
from genrm_operator.core.judge import judge_revision
from genrm_operator.core.names import JUDGE_REVISION_LABEL

BASE: dict[str, Any] = {"replicas": 2, "model": {"path": "org/judge-7b"}}


def spec(**wire: Any) -> GenRMPoolSpec:
    return GenRMPoolSpec.model_validate({**BASE, **wire})


@pytest.mark.parametrize("change", [
    {"model": {"path": "org/judge-8b"}},
    {"model": {"path": "org/judge-7b", "revision": "v2"}},
    {"model": {"path": "org/judge-7b", "servedName": "judge"}},
    {"engine": {"image": "lmsysorg/sglang:other"}},
    {"engine": {"command": ["genrm-sim"]}},
    {"engine": {"args": ["--model-path", "org/judge-7b"]}},
    {"engine": {"extraArgs": ["--chat-template", "rubric-v2"]}},
    {"engine": {"seed": 7}},
    {"engine": {"deterministic": False}},
    {"engine": {"tensorParallelSize": 2, "gpusPerReplica": 2}},
], ids=lambda change: next(iter(change.values())).__repr__()[:40])
def test_each_field_that_changes_answers_changes_the_revision(change: dict[str, Any]) -> None:
    assert judge_revision(spec(**change)) != judge_revision(spec())


@pytest.mark.parametrize("change", [
    {"replicas": 5},
    {"engine": {"resources": {"limits": {"memory": "64Gi"}}, "env": [{"name": "X", "value": "1"}]}},
    {"gateway": {"maxRequestBodyBytes": 1024}},
    {"drain": {"timeoutSeconds": 99}},
    {"template": {"labels": {"team": "rl"}, "nodeSelector": {"pool": "gpu"}}},
], ids=lambda change: next(iter(change)))
def test_a_rolling_change_keeps_the_revision_though_it_changes_the_template(change: dict[str, Any]) -> None:
    """A step whose replicas differ only in what shapes their pods got verdicts from one judge."""
    before, after = spec(), spec(**change)
    assert judge_revision(after) == judge_revision(before)
    if "replicas" not in change:
        assert children.template_revision("judge", after) != children.template_revision("judge", before)


def test_the_revision_is_fit_for_a_label_a_header_and_a_weight_version() -> None:
    assert re.fullmatch(JUDGE_REVISION_PATTERN, judge_revision(spec()))


def test_every_replica_carries_its_judge_revision_to_the_engine_the_gateway_and_its_labels() -> None:
    pool = spec(engine={"extraArgs": ["--weight-version", "mine"]})
    revision = judge_revision(pool)
    pod = children.pod_manifest("judge", "uid", "ml", pool, "judge-3", 3)
    engine, gateway = pod["spec"]["containers"]
    assert pod["metadata"]["labels"][JUDGE_REVISION_LABEL] == revision
    assert engine["args"][-2:] == ["--weight-version", revision], "the last value is the one SGLang keeps"
    flag = gateway["args"].index(JUDGE_REVISION_FLAG)
    assert gateway["args"][flag + 1] == revision
