"""Load spread on the local cluster: keep-alive clients reach the replicas a scale-out adds.

Aspects: the keep-alive client mix (`spread.MIX`: httpx, requests, aiohttp and openai at their
defaults) sends back to back through the pool's ClusterIP (kube-proxy places connections, not
requests). After a scale 1 -> 4, within 10 s of the 4th publish every replica serves at least 15%
of a 5 s window's requests, and over the 30 s after that the first replica serves at most 40%;
after a rollout of the same pool, and after the built-in autoscaler (Auto, InFlight) scales a pool
out under the same clients, every replica gets its share the same way (at least 0.6x and at most
1.6x an even share). Nothing fails, and the openai clients' retries are counted and reported.
"""

from __future__ import annotations

import json
import time

from .harness import TALLY, Cluster, pool_manifest, served_model, wait_for
from .spread import EVEN_FLOOR, KeepAliveClients, ShareMeter

ENGINE = {"extraArgs": ["--sim-startup-seconds", "1", "--sim-ttft-ms", "5", "--sim-itl-ms", "5"]}
SPREAD_WITHIN_SECONDS = 10.0
HOLD_SECONDS = 30.0


def _spread_after(meter: ShareMeter, published_at: float, replicas: list[str]) -> tuple[float, dict[str, float]]:
    """The end of the first 5 s window within 10 s of ``published_at`` in which every replica served
    at least 0.6x an even share, and that window's shares."""
    end, shares = meter.first_even_window(published_at, replicas, SPREAD_WITHIN_SECONDS)
    assert end is not None, (f"no 5 s window within {SPREAD_WITHIN_SECONDS} s of the last publish gave every "
                             f"replica of {replicas} {EVEN_FLOOR / len(replicas):.0%}: last window's shares {shares}")
    return end, shares


def _held(meter: ShareMeter, start: float) -> dict[str, float]:
    """The shares over the ``HOLD_SECONDS`` from ``start``."""
    meter.wait_until(start + HOLD_SECONDS)
    return meter.shares(start, start + HOLD_SECONDS)


def _no_failures(clients: KeepAliveClients) -> None:
    """Nothing failed, and no openai retry saved a request (its default retries would hide a loss)."""
    TALLY.plain_requests += clients.stats.sent
    TALLY.plain_failed += len(clients.stats.failures)
    assert not clients.stats.failures, [str(f) for f in clients.stats.failures[:20]]
    assert clients.openai_retries == 0


def test_keep_alive_clients_reach_replicas_added_by_a_scale_out_and_a_rollout(cluster: Cluster, namespace: str) -> None:
    name = "spread"
    cluster.kubectl("apply", "-f", "-", input=pool_manifest(name, namespace, replicas=1, engine=ENGINE))
    cluster.wait_serving(namespace, name, 1)
    url = cluster.service_answering(namespace, name)
    model = served_model(cluster.pool(namespace, name))
    (first,) = cluster.published(namespace, name)
    with ShareMeter(lambda: cluster.pod_addresses(namespace, name)) as meter, KeepAliveClients(url, model) as clients:
        wait_for("every client kind answered", lambda: clients.ok_everywhere(10), timeout=60)
        cluster.scale(namespace, name, 4)
        wait_for("4 replicas serving", lambda: cluster.serving_replicas(namespace, name) == 4,
                 timeout=120, interval=0.2)
        published_at = time.monotonic()
        replicas = cluster.published(namespace, name)
        assert len(replicas) == 4 and first in replicas, replicas
        spread_at, window = _spread_after(meter, published_at, replicas)
        held = _held(meter, spread_at)
        assert held[first] <= 0.40, held
        new_shares = [share for pod, share in held.items() if pod != first]
        print(f"\nspread-e2e: scale 1->4 spread_s={spread_at - published_at:.1f} window={_fmt(window)} "
              f"held={_fmt(held)} requests={clients.stats.sent} openai_retries={clients.openai_retries} "
              f"by_kind={_by_kind(clients, spread_at)}")
        TALLY.spread_old_share = held[first]
        TALLY.spread_min_new_share = min(new_shares)

        # A rollout replaces every replica; the last replacement's publish is the moment that counts.
        generation = cluster.pool(namespace, name)["metadata"]["generation"]
        cluster.kubectl("patch", "genrmpool", name, "-n", namespace, "--type", "merge", "-p",
                        json.dumps({"spec": {"engine": {"env": [{"name": "JUDGE_MODE", "value": "strict"}]}}}))
        rolled = cluster.wait_serving(namespace, name, 4, timeout=240)
        assert rolled["metadata"]["generation"] > generation
        published_at = time.monotonic()
        replicas = cluster.published(namespace, name)
        assert first not in replicas, replicas
        spread_at, window = _spread_after(meter, published_at, replicas)
        held = _held(meter, spread_at)
        assert max(held.values()) <= 0.40, held
        print(f"spread-e2e: rollout spread_s={spread_at - published_at:.1f} window={_fmt(window)} "
              f"held={_fmt(held)} requests={clients.stats.sent} openai_retries={clients.openai_retries} "
              f"by_kind={_by_kind(clients, spread_at)}")
    _no_failures(clients)


AUTOSCALING = {
    "mode": "Auto", "minReplicas": 1, "maxReplicas": 3, "intervalSeconds": 2,
    "metrics": [{"type": "InFlight", "target": {"averageValue": "4"}}],
    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}},
}


def test_keep_alive_clients_reach_replicas_the_autoscaler_adds(cluster: Cluster, namespace: str) -> None:
    name = "autospread"
    cluster.kubectl("apply", "-f", "-", input=pool_manifest(name, namespace, replicas=1, engine=ENGINE,
                                                            autoscaling=AUTOSCALING))
    cluster.wait_serving(namespace, name, 1)
    url = cluster.service_answering(namespace, name)
    model = served_model(cluster.pool(namespace, name))
    with ShareMeter(lambda: cluster.pod_addresses(namespace, name)) as meter, KeepAliveClients(url, model) as clients:
        wait_for("the autoscaler's scale-out to 3", lambda: cluster.serving_replicas(namespace, name) == 3,
                 timeout=120, interval=0.2)
        published_at = time.monotonic()
        replicas = cluster.published(namespace, name)
        spread_at, window = _spread_after(meter, published_at, replicas)
        held = _held(meter, spread_at)
        assert max(held.values()) <= 1.6 / 3, held
        print(f"\nspread-e2e: autoscaler 1->3 spread_s={spread_at - published_at:.1f} window={_fmt(window)} "
              f"held={_fmt(held)} requests={clients.stats.sent} openai_retries={clients.openai_retries} "
              f"by_kind={_by_kind(clients, spread_at)}")
    _no_failures(clients)


def _by_kind(clients: KeepAliveClients, start: float) -> str:
    """Each client kind's answers over the hold, as the shares of the replicas that gave them (largest first)."""
    shares = clients.kind_shares(start, start + HOLD_SECONDS)
    return ";".join(f"{kind}:" + "/".join(f"{share:.2f}" for share in values) for kind, values in shares.items())


def _fmt(shares: dict[str, float]) -> str:
    return ",".join(f"{pod.rsplit('-', 1)[-1]}:{share:.2f}" for pod, share in sorted(shares.items()))
