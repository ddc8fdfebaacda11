"""Rolling updates of the pod template on the local cluster: surge, verify, publish, drain.

Aspects: on a 3-replica pool under load from unmodified clients through the Service, one patch
of the gateway's resources and an engine env var replaces every replica (every pod on
status.updateRevision, updatedReplicas 3, a Rollout Succeeded in the history) without a failed
request; a second template change, with the operator SIGKILLed once the first replacement is
published and restarted, converges the same way, again without loss. A surge replica no node
can take (a nodeSelector nothing matches) stops the rollout with RolloutBlocked=True naming the
scheduler's message and a Warning event while every old replica keeps serving; patching the
selector back ends the rollout. With updateStrategy OnDelete a template change leaves the pods
alone until one is deleted by hand, whose replacement has the new revision.

Two template changes in quick succession under the same load (the second while the first's surge
replica is not yet published) retarget one rollout: it retires that surge replica itself, which
the node agent, like a kubelet, ends Succeeded or Failed while it terminates, and the rollout still
ends Succeeded with no RolloutPartial or other Warning event and no request lost; a scale-out issued
right after starts within a second (nothing left to back off from).
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from kubernetes import client

from .harness import Cluster, OperatorProcess, account_plain, plain_report, pool_manifest, wait_for
from .plainclients import PlainClients

REVISION = "genrm.io/revision"


def _patch(cluster: Cluster, namespace: str, name: str, spec: dict[str, Any]) -> None:
    cluster.kubectl("patch", "genrmpool", name, "-n", namespace, "--type", "merge", "-p",
                    json.dumps({"spec": spec}))


def _live(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return [p for p in cluster.pods(namespace, name) if not p["metadata"].get("deletionTimestamp")]


def _revisions(pods: list[dict[str, Any]]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["labels"].get(REVISION, "") for p in pods}


def _operation(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return dict((cluster.pool(namespace, name).get("status") or {}).get("operation") or {})


def _condition(pool: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (pool.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def _rolled_out(cluster: Cluster, namespace: str, name: str, replicas: int, old_revision: str) -> dict[str, Any]:
    """Wait until the pool is converged on a new revision; return the pool."""
    def done() -> dict[str, Any] | None:
        pool = cluster.pool(namespace, name)
        status = pool.get("status") or {}
        new = status.get("updateRevision")
        revisions = set(_revisions(_live(cluster, namespace, name)).values())
        ok = (new and new != old_revision and revisions == {new} and status.get("updatedReplicas") == replicas
              and status.get("currentRevision") == new)
        return pool if ok else None
    cluster.wait_serving(namespace, name, replicas, timeout=240)
    return wait_for(f"{namespace}/{name} on the new revision", done, timeout=60)


def _failed_at(plain: PlainClients, started: float) -> str:
    """The failures, verbatim, and when each ended (seconds after the patch), to match with events."""
    return f"{plain_report(plain)}\nended at +s: {[round(f.at - started, 1) for f in plain.stats.failures]}"


def _replaced_without_loss(cluster: Cluster, namespace: str, name: str, plain: PlainClients, started: float,
                           before: set[str], replicas: int) -> set[str]:
    """The pods after a rollout: all ``replicas`` of ``before`` replaced, and no plain-client request failed."""
    account_plain(plain)
    assert plain.stats.failed == 0, _failed_at(plain, started)
    after = set(_revisions(_live(cluster, namespace, name)))
    assert len(before - after) == replicas and not before & after, (before, after)
    return after


def _assert_last_rollout_succeeded(pool: dict[str, Any]) -> dict[str, Any]:
    last = pool["status"]["history"][-1]
    assert (last["type"], last["outcome"]) == ("Rollout", "Succeeded"), last
    return dict(last)


def test_rolling_update_under_load_and_through_an_operator_kill_loses_nothing(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    name, replicas = "roll", 3
    cluster.kubectl("apply", "-f", "-", input=pool_manifest(name, namespace, replicas=replicas))
    pool = cluster.wait_serving(namespace, name, replicas)
    first = pool["status"]["updateRevision"]
    before = set(_revisions(_live(cluster, namespace, name)))
    assert set(_revisions(_live(cluster, namespace, name)).values()) == {first}

    # 1. The gateway's resources and an engine env var in one patch.
    with cluster.plain_clients(namespace, name) as plain:
        wait_for("first requests", lambda: plain.ok_everywhere(5))
        started, sent = time.monotonic(), plain.stats.total_sent
        _patch(cluster, namespace, name, {
            "gateway": {"resources": {"requests": {"cpu": "20m", "memory": "48Mi"}}},
            "engine": {"env": [{"name": "JUDGE_MODE", "value": "strict"}]}})
        pool = _rolled_out(cluster, namespace, name, replicas, first)
        seconds = time.monotonic() - started
        time.sleep(2)
    after = _replaced_without_loss(cluster, namespace, name, plain, started, before, replicas)
    replaced = len(before - after)
    last = _assert_last_rollout_succeeded(pool)
    assert f"{replicas} replica(s) replaced" in last["message"], last
    second = pool["status"]["updateRevision"]
    print(f"\nrollout-e2e: replaced={replaced} requests={plain.stats.total_sent - sent} "
          f"failed={plain.stats.failed} seconds={seconds:.1f}")

    # 2. Another template change; SIGKILL the operator once the first replacement is published.
    before = after
    with cluster.plain_clients(namespace, name) as plain:
        wait_for("first requests", lambda: plain.ok_everywhere(5))
        started, sent = time.monotonic(), plain.stats.total_sent
        _patch(cluster, namespace, name, {"engine": {"env": [{"name": "JUDGE_MODE", "value": "lenient"}]}})
        killed_in = wait_for("the first replacement published (an outdated replica retiring)", lambda: (
            op := _operation(cluster, namespace, name)).get("type") == "Rollout"
            and op.get("phase") in ("Unpublishing", "Fencing", "Draining", "Removing") and op,
            timeout=120, interval=0.2)
        operator.kill()
        time.sleep(3)
        operator.start()
        pool = _rolled_out(cluster, namespace, name, replicas, second)
        seconds = time.monotonic() - started
        time.sleep(2)
    after = _replaced_without_loss(cluster, namespace, name, plain, started, before, replicas)
    replaced = len(before - after)
    _assert_last_rollout_succeeded(pool)
    names = [p["metadata"]["name"] for p in cluster.pods(namespace, name)]
    assert len(names) == len(set(names)) == replicas, names
    print(f"rollout-e2e-operator-kill: killed_in={killed_in['phase']} replaced={replaced} "
          f"requests={plain.stats.total_sent - sent} failed={plain.stats.failed} seconds={seconds:.1f}")


def _generate(pod: dict[str, Any]) -> int:
    body = {"text": "Judge answer: is 2+2=4?", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    return httpx.post(f"http://{pod['status']['podIP']}:8000/generate", json=body, timeout=10.0).status_code


def test_unschedulable_surge_blocks_the_rollout_and_on_delete_waits_for_a_deletion(
    cluster: Cluster, namespace: str
) -> None:
    name, replicas = "block", 2
    cluster.kubectl("apply", "-f", "-", input=pool_manifest(name, namespace, replicas=replicas))
    pool = cluster.wait_serving(namespace, name, replicas)
    first = pool["status"]["updateRevision"]
    old = _live(cluster, namespace, name)

    # 3. A surge replica no node can take, with maxUnavailable 0: RolloutBlocked, old replicas serve.
    with cluster.plain_clients(namespace, name) as plain:
        wait_for("first requests", lambda: plain.ok_everywhere(5))
        _patch(cluster, namespace, name, {"template": {"nodeSelector": {"genrm.io/e2e": "nowhere"}}})

        def blocked() -> tuple[dict[str, Any], dict[str, Any]] | None:
            pool = cluster.pool(namespace, name)
            cond = _condition(pool, "RolloutBlocked")
            return (pool, cond) if cond.get("status") == "True" else None
        pool, cond = wait_for("RolloutBlocked=True", blocked, timeout=90)
        assert cond["reason"] == "SurgeBlocked", cond
        surge = [p for p in _live(cluster, namespace, name) if p["metadata"]["labels"].get(REVISION) != first]
        assert len(surge) == 1, _revisions(surge)
        scheduled = next(c for c in surge[0]["status"]["conditions"] if c["type"] == "PodScheduled")
        assert scheduled["reason"] == "Unschedulable", scheduled
        assert scheduled["message"] in cond["message"], (scheduled, cond)
        assert "maxUnavailable=0" in cond["message"], cond
        events = client.CoreV1Api(cluster.api).list_namespaced_event(namespace).items
        warnings = [e for e in events if e.reason == "RolloutBlocked" and e.type == "Warning"]
        assert warnings and scheduled["message"] in warnings[0].message, [(e.type, e.message) for e in warnings]
        time.sleep(3)  # stays blocked: nothing drained, every old replica still serves
        status = cluster.pool(namespace, name)["status"]
        assert status["servingReplicas"] == replicas and status["operation"]["type"] == "Rollout", status
        assert {p["metadata"]["name"] for p in _live(cluster, namespace, name)} == \
            {p["metadata"]["name"] for p in old} | {surge[0]["metadata"]["name"]}
        assert [_generate(p) for p in old] == [200] * replicas

        # Undo: the selector goes, the revision is the first one again and the rollout ends.
        _patch(cluster, namespace, name, {"template": {"nodeSelector": None}})
        pool = cluster.wait_serving(namespace, name, replicas, timeout=120)
        time.sleep(1)
    account_plain(plain)
    assert plain.stats.failed == 0, plain_report(plain)
    assert pool["status"]["updateRevision"] == first
    assert _revisions(_live(cluster, namespace, name)) == _revisions(old)
    last = _assert_last_rollout_succeeded(pool)
    assert _condition(pool, "RolloutBlocked").get("status") != "True", pool["status"]["conditions"]
    print(f"\nrollout-e2e-blocked: old_serving={replicas} requests={plain.stats.total_sent} "
          f"failed={plain.stats.failed} undo_outcome={last['outcome']} ({last['message']})")

    # 4. OnDelete: the template change waits for a deletion by hand.
    ops = pool["status"]["operationCount"]
    _patch(cluster, namespace, name, {"updateStrategy": {"type": "OnDelete"},
                                      "engine": {"env": [{"name": "JUDGE_MODE", "value": "strict"}]}})
    wait_for("the change observed", lambda: (p := cluster.pool(namespace, name))["status"].get(
        "observedGeneration") == p["metadata"]["generation"] and p["status"]["updateRevision"] != first)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status = cluster.pool(namespace, name)["status"]
        assert _revisions(_live(cluster, namespace, name)) == _revisions(old)
        assert status["updatedReplicas"] == 0 and not status.get("operation"), status
        assert status["operationCount"] == ops, status
        time.sleep(1)
    new = status["updateRevision"]
    victim = old[0]["metadata"]["name"]
    cluster.kubectl("delete", "pod", victim, "-n", namespace, "--wait=false")

    def replaced() -> dict[str, Any] | None:
        pool = cluster.pool(namespace, name)
        revisions = _revisions(_live(cluster, namespace, name))
        ok = (victim not in revisions and sorted(revisions.values()) == sorted([first, new])
              and pool["status"].get("updatedReplicas") == 1)
        return pool if ok else None
    wait_for("one replacement on the new revision", replaced, timeout=120)
    pool = cluster.wait_serving(namespace, name, replicas, timeout=120)
    assert pool["status"]["updatedReplicas"] == 1, pool["status"]
    assert _revisions(_live(cluster, namespace, name))[old[1]["metadata"]["name"]] == first
    print(f"rollout-e2e-ondelete: updatedReplicas={pool['status']['updatedReplicas']} "
          f"untouched=1 new_revision={new}")


def test_two_quick_template_changes_retarget_one_rollout_that_succeeds_and_delays_no_scale_out(
    cluster: Cluster, namespace: str
) -> None:
    name, replicas = "retarget", 3
    cluster.kubectl("apply", "-f", "-", input=pool_manifest(name, namespace, replicas=replicas))
    pool = cluster.wait_serving(namespace, name, replicas)
    first, ops = pool["status"]["updateRevision"], pool["status"]["operationCount"]
    before = set(_revisions(_live(cluster, namespace, name)))

    with cluster.plain_clients(namespace, name) as plain:
        wait_for("first requests", lambda: plain.ok_everywhere(5))
        started = time.monotonic()
        _patch(cluster, namespace, name, {"engine": {"env": [{"name": "JUDGE_MODE", "value": "strict"}]}})
        surge = wait_for("the surge replica, not yet published", lambda: [
            p for p in _live(cluster, namespace, name) if p["metadata"]["labels"].get(REVISION) != first
            and p["metadata"]["labels"].get("genrm.io/published") != "true"], timeout=60, interval=0.1)[0]
        between = surge["metadata"]["labels"][REVISION]
        _patch(cluster, namespace, name, {"engine": {"env": [{"name": "JUDGE_MODE", "value": "lenient"}]}})
        retargeted_in = time.monotonic() - started
        pool = _rolled_out(cluster, namespace, name, replicas, first)
        seconds = time.monotonic() - started

        # A scale-out right after: no back-off holds it (the clock starts before kubectl does).
        issued = time.monotonic()
        cluster.scale(namespace, name, replicas + 1)
        pools = client.CustomObjectsApi(cluster.api)
        status = wait_for("the scale-out to start", lambda: (s := pools.get_namespaced_custom_object(
            "genrm.io", "v1alpha1", namespace, "genrmpools", name).get("status") or {}).get(
            "operationCount", 0) > ops + 1 and s, timeout=30, interval=0.05)
        waited = time.monotonic() - issued
        scaled = cluster.wait_serving(namespace, name, replicas + 1)
        time.sleep(1)
    account_plain(plain)
    assert plain.stats.failed == 0, _failed_at(plain, started)

    assert pool["status"]["updateRevision"] not in (first, between), (first, between, pool["status"])
    history = [h for h in scaled["status"]["history"] if int(h["id"].removeprefix("op-")) > ops]
    assert [(h["type"], h["outcome"]) for h in history] == [("Rollout", "Succeeded"), ("ScaleOut", "Succeeded")], \
        history
    assert (status.get("operation") or history[1])["type"] == "ScaleOut", status
    events = client.CoreV1Api(cluster.api).list_namespaced_event(namespace).items
    assert any(e.reason == "RolloutRetargeted" for e in events), [e.reason for e in events]
    warnings = [(e.reason, e.message) for e in events if e.type == "Warning" or e.reason == "RolloutPartial"]
    assert not warnings, warnings
    assert waited < 1.0, f"the scale-out started {waited:.2f}s after it was issued"
    after = set(_revisions(_live(cluster, namespace, name)))
    assert not before & after and surge["metadata"]["name"] not in after, (before, after)
    print(f"\nrollout-e2e-retarget: second_change_at_s={retargeted_in:.1f} rollout_s={seconds:.1f} "
          f"outcome={history[0]['outcome']} scale_out_start_s={waited:.2f} requests={plain.stats.total_sent} "
          f"failed={plain.stats.failed}")
