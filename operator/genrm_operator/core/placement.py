"""GPU-generation-aware placement of the replicas of a pool whose answers are compared.

Why: deterministic inference makes a replica's answers reproducible on one kind of GPU, not across
kinds. With ``--enable-deterministic-inference`` and no ``--attention-backend``, SGLang 0.5.23
falls back to ``fa3`` below SM100 and to ``flashinfer`` on SM100/SM120 (Blackwell)
(``_deterministic_attention_backend`` in ``srt/arg_groups/overrides.py``), and even one backend
runs other kernels on another generation. Greedy answers (a pool verified with sampling Greedy,
whose engine has no deterministic inference) are no better: the argmax of other kernels' logits
can differ too. A pool whose replicas land on two GPU generations then fails verification on
every cross pair. So a new replica is required onto nodes whose GPU feature
discovery label ``nvidia.com/gpu.product`` has the value of the replica it will be verified
against: the oldest serving one (`reference`), or while none serves, the oldest scheduled one.

Nodes without the label (no GPU feature discovery, the local test cluster, the simulator) give no
pin: placement is then the scheduler's and the user's alone. A user whose own nodeSelector or
node affinity already chooses the product keeps that choice (`user_pins_product`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..api.pool import GenRMPoolSpec
from ..api.spec import TemplateSpec
from ..api.status import Placement
from .classify import Replica, Role

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
"""The node label GPU feature discovery sets to the GPU's product name (e.g. NVIDIA-H100-80GB-HBM3)."""
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def reference(replicas: Iterable[Replica]) -> Replica | None:
    """The replica a new one is verified against: the oldest serving one (the oldest have proven themselves)."""
    return min((r for r in replicas if r.role is Role.SERVING), key=lambda r: r.pod.created_at, default=None)


def _terms(affinity: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    node_affinity = affinity.get("nodeAffinity") or {}
    return list((node_affinity.get(REQUIRED) or {}).get("nodeSelectorTerms") or [])


def constrains_product(term: Mapping[str, Any]) -> bool:
    """Whether a node selector term has an expression on the GPU product label: the user's choice."""
    return any(e.get("key") == GPU_PRODUCT_LABEL for e in term.get("matchExpressions") or [])


def user_pins_product(template: TemplateSpec) -> bool:
    """Whether the user's own nodeSelector, or every one of their required node selector terms,
    already constrains the GPU product: then the user chose, and the operator adds nothing."""
    terms = _terms(template.affinity)
    return GPU_PRODUCT_LABEL in template.node_selector or (bool(terms) and all(map(constrains_product, terms)))


def compares_answers(spec: GenRMPoolSpec) -> bool:
    """Whether the pool has answers to keep equal across replicas: a deterministic one's (reproducible
    on one GPU generation), or a verified one's (a non-deterministic pool can be verified only with
    greedy probes, which another generation's kernels answer otherwise). A non-deterministic pool
    without verification has none: its sampled answers differ anyway and nothing compares them."""
    return spec.engine.deterministic or spec.verification.enabled


def choose(spec: GenRMPoolSpec, replicas: Sequence[Replica], products: Mapping[str, str]) -> Placement | None:
    """The GPU product new replicas are required onto, or None for no pin.

    Only a pool with answers to keep equal is pinned (`compares_answers`), and only when the user
    has not chosen a product (`user_pins_product`). The anchor is the
    replica new ones are verified against (`reference`); while no replica serves, the oldest one
    already scheduled on a labelled node, so replicas created later follow the first. No anchor,
    or an anchor on a node without the label (``products`` holds only labelled nodes): no pin."""
    if not compares_answers(spec) or user_pins_product(spec.template):
        return None
    anchor = reference(replicas)
    if anchor is None:
        starting = [r for r in replicas if r.role is Role.STARTING and r.pod.node in products]
        anchor = min(starting, key=lambda r: (r.pod.created_at, r.pod.name), default=None)
    if anchor is None or anchor.pod.node not in products:
        return None
    return Placement(gpu_product=products[anchor.pod.node], replica=anchor.pod.name, node=anchor.pod.node)


def misplaced(replica: Replica, pin: Placement, products: Mapping[str, str]) -> bool:
    """A replica that never served and runs on a node of another GPU product than the pin: it
    would fail verification against the reference (or, without one, serve other answers than the
    replicas that follow the pin), so it is replaced before it is verified. A node without the
    label is no evidence either way: verification decides."""
    pod = replica.pod
    product = products.get(pod.node, "")
    return replica.role is Role.STARTING and not pod.ever_published and product not in ("", pin.gpu_product)


def describe(replica: Replica, products: Mapping[str, str]) -> str:
    """``judge-1 on node gpu-7 (GPU NVIDIA-B200)``: where a replica runs, for verification messages."""
    pod = replica.pod
    product = products.get(pod.node)
    return f"{pod.name} on node {pod.node or 'unknown'} ({f'GPU {product}' if product else 'no GPU product label'})"


def verification_context(candidate: Replica, ref: Replica | None, products: Mapping[str, str]) -> str:
    """Both replicas of a verification and their GPUs, so a mismatch says whether GPU generations differ."""
    if ref is None:
        return describe(candidate, products)
    context = f"{describe(candidate, products)} against {describe(ref, products)}"
    mine, theirs = products.get(candidate.pod.node, ""), products.get(ref.pod.node, "")
    if mine and theirs and mine != theirs:
        context += "; the GPU products differ, and SGLang's kernels differ across GPU generations"
    return context


def require_product(node_selector: Mapping[str, str], affinity: Mapping[str, Any], product: str) -> dict[str, Any]:
    """``affinity`` with ``nvidia.com/gpu.product In [product]`` added to every required node
    selector term (a copy; the spec's own objects are never changed).

    Terms are ORed and a term's expressions ANDed, so adding the requirement to every term ANDs
    it with the user's whole selector. A term that already constrains the product keeps the
    user's choice, and a nodeSelector on the label (ANDed with every term by the scheduler) leaves
    the affinity as it is: the operator never makes a pod unschedulable by contradicting the user."""
    merged = copy.deepcopy(dict(affinity))
    if GPU_PRODUCT_LABEL in node_selector:
        return merged
    requirement = {"key": GPU_PRODUCT_LABEL, "operator": "In", "values": [product]}
    node_affinity = merged.get("nodeAffinity") or {}
    required = node_affinity.get(REQUIRED) or {}
    required["nodeSelectorTerms"] = [
        term if constrains_product(term)
        else {**term, "matchExpressions": [*(term.get("matchExpressions") or []), requirement]}
        for term in _terms(merged) or [{}]
    ]
    merged["nodeAffinity"] = {**node_affinity, REQUIRED: required}
    return merged
