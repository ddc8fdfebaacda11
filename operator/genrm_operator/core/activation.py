"""Scale from zero: when the pool's Service points at the activator, and what the activator is told.

Why an EndpointSlice of the operator's own: kube-proxy programs a Service from every EndpointSlice
labelled with its name, whoever made it, while the EndpointSlice controller manages only its own
(``endpointslice.kubernetes.io/managed-by``). So the pool's Service keeps its selector (published
replicas, the controller's slices), and a second slice naming the activator's pods is added while
the pool has no serving replica: clients reach the activator through the same ClusterIP, with no
change on their side, and never meet a Service without endpoints.

The activator's slice is wanted while the pool may go to zero (``scaleToZero``) and either is
meant to be at zero or has no ready endpoint in the controller's slices; it goes once one does.
It is in place before the last replica is unpublished (`scale_in` waits for it), so a request
arriving while the last replica drains is held, not refused. Pure: the shell passes the watched
slices and the activator's addresses in.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from genrm_contract.activator import PoolRoute
from genrm_contract.sidecar import TRAFFIC_PORT_NAME

from .children import Manifest
from .model import ActivatorView, Observed
from .names import activator_slice_name, common_labels, service_name

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
CONTROLLER = "endpointslice-controller.k8s.io"
MANAGED_BY = "genrm-operator"
MAX_HELD = 1024
"""Requests one activator holds for one pool; more get ``503 holdQueueFull``."""


def controller_slices(pool: str, objects: Iterable[Manifest]) -> Iterator[Manifest]:
    """The EndpointSlices the EndpointSlice controller keeps for the pool's Service (not the activator's)."""
    for obj in objects:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if obj.get("kind") == "EndpointSlice" and labels.get(MANAGED_BY_LABEL) == CONTROLLER \
                and labels.get(SERVICE_NAME_LABEL) == service_name(pool):
            yield obj


def ready_endpoints(slice_: Manifest) -> Iterator[Manifest]:
    """The endpoints of one slice that are ready: those kube-proxy sends new connections to."""
    return (e for e in slice_.get("endpoints") or [] if (e.get("conditions") or {}).get("ready"))


def serving_addresses(pool: str, objects: Iterable[Manifest]) -> tuple[str, ...]:
    """``ip:port`` of every ready endpoint the EndpointSlice controller lists for the pool's Service:
    what kube-proxy sends the pool's clients to, and so where held requests go."""
    found: list[str] = []
    for obj in controller_slices(pool, objects):
        port = next((p.get("port") for p in obj.get("ports") or [] if p.get("name") == TRAFFIC_PORT_NAME), None)
        if obj.get("addressType", "IPv4") != "IPv4" or not port:
            continue
        for endpoint in ready_endpoints(obj):
            found.extend(f"{a}:{port}" for a in endpoint.get("addresses") or [])
    return tuple(sorted(found))


def ready_pods(pool: str, objects: Iterable[Manifest]) -> frozenset[str]:
    """The pods the pool's Service lists as ready endpoints (`Observed.endpoints`): a published replica
    serves its clients only from then on, whatever its labels and conditions say before."""
    return frozenset(ref["name"] for obj in controller_slices(pool, objects) for endpoint in ready_endpoints(obj)
                     if (ref := endpoint.get("targetRef") or {}).get("kind") == "Pod" and ref.get("name"))


def wants_activator(obs: Observed, serving: tuple[str, ...]) -> bool:
    """Whether the pool's Service should also point at the activator now."""
    activator = obs.children.activator if obs.children is not None else None
    if activator is None or not activator.addresses or obs.spec.autoscaling.scale_to_zero is None:
        return False
    return obs.spec.replicas == 0 or not serving


def activator_in_place(obs: Observed) -> bool:
    """Whether the activator's slice exists and lists only activators that have the pool's route (the
    shell passes only those): the last replica may go."""
    if obs.children is None or obs.children.activator is None:
        return True  # no activator configured: scale to zero refuses at zero, nothing to wait for
    have = obs.children.objects.get("EndpointSlice")
    addresses = {a for e in (have or {}).get("endpoints") or [] for a in e.get("addresses") or []}
    return bool(addresses) and addresses <= set(obs.children.activator.addresses)


def slice_manifest(pool: str, pool_uid: str, namespace: str, activator: ActivatorView,
                   owner: Mapping[str, object]) -> Manifest:
    """The activator's EndpointSlice for the pool's Service (an IPv4 slice: the local and most clusters)."""
    labels = {**common_labels(pool), SERVICE_NAME_LABEL: service_name(pool), MANAGED_BY_LABEL: MANAGED_BY}
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": activator_slice_name(pool), "namespace": namespace, "labels": labels,
                     "ownerReferences": [dict(owner)]},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [a], "conditions": {"ready": True}} for a in sorted(activator.addresses)],
        "ports": [{"name": TRAFFIC_PORT_NAME, "port": activator.port, "protocol": "TCP"}],
    }


def pool_route(obs: Observed) -> PoolRoute | None:
    """What the activators are told about the pool (None: nothing, it never goes to zero): the Host
    values its clients send (the Service's DNS names and ClusterIP) and where held requests go."""
    c = obs.children
    if c is None or obs.spec.autoscaling.scale_to_zero is None:
        return None
    service = c.objects.get("Service") or {}
    cluster_ip = (service.get("spec") or {}).get("clusterIP")
    return route(obs, c.namespace, serving_addresses(obs.name, c.slices),
                 cluster_ip if cluster_ip and cluster_ip != "None" else None, obs.spec.service.port)


def route(obs: Observed, namespace: str, serving: tuple[str, ...], cluster_ip: str | None, port: int) -> PoolRoute:
    """The pool's route from what was observed of its Service."""
    name = service_name(obs.name)
    # The activator cuts a Service's DNS name after ".svc" (any cluster domain) before matching, and
    # refuses a bare name two pools claim.
    names = [name, f"{name}.{namespace}", f"{name}.{namespace}.svc"]
    if cluster_ip:
        names.append(cluster_ip)
    hosts = [h for n in names for h in (n, f"{n}:{port}")]
    scale = obs.spec.autoscaling.scale_to_zero
    hold = scale.hold_timeout_seconds if scale is not None and scale.hold_timeout_seconds else \
        min(obs.spec.engine.startup_timeout_seconds, 3600)
    return PoolRoute(hosts=tuple(hosts), targets=serving, hold_timeout_seconds=hold, max_held=MAX_HELD)
