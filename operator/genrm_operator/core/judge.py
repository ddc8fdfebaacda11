"""The judge revision: a name for what a pool's replicas answer, carried by every answer.

A trainer must know which judge produced each verdict: rewards from two judges in one training step
are not comparable. The pod template's revision (`children.template_revision`) changes with
anything that shapes a pod, resources and scheduling included, so a rolling update that changes no
answer would look like a judge change. The judge revision is a hash of the fields that change what
the judge answers, the ones v1alpha1 keeps immutable: the model and the engine's image, command,
arguments, seed, determinism and tensor parallelism. The engine reports it as its weight version
(SGLang's ``--weight-version``: ``meta_info.weight_version`` of ``/generate``, ``metadata`` of chat
completions) and the gateway as ``x-genrm-revision`` on every response (`genrm_contract.sidecar`).
"""

from __future__ import annotations

import hashlib
import json

from ..api.pool import GenRMPoolSpec

JUDGE_REVISION_LENGTH = 10
"""Hex digits kept: a label value, a header and a weight version short enough to read in a log."""


def judge_fields(spec: GenRMPoolSpec) -> dict[str, object]:
    """What a replica answers depends on, and nothing else (see the module's docstring)."""
    engine, model = spec.engine, spec.model
    # Named one by one, not dumped: a field added later with a default must not change every pool's
    # revision on an operator upgrade.
    return {
        "model": {"path": model.path, "servedName": model.served_name, "revision": model.revision},
        "engine": {"image": engine.image, "command": engine.command, "args": engine.args,
                   "extraArgs": engine.extra_args, "seed": engine.seed, "deterministic": engine.deterministic,
                   "tensorParallelSize": engine.tensor_parallel_size},
    }


def judge_revision(spec: GenRMPoolSpec) -> str:
    """The judge revision of ``spec``: equal for two specs exactly when their `judge_fields` are."""
    canonical = json.dumps(judge_fields(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:JUDGE_REVISION_LENGTH]
