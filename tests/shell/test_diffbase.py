"""The operator's kopf diff base: nothing is copied, compared or stored for any object.

Aspects under test: the essence kopf builds of an event's body is empty whatever the body holds,
the stored one too (so kopf sees no change to diff); storing patches nothing onto the object.
"""

from __future__ import annotations

import kopf
from genrm_operator.shell.handlers import NoDiffBase


def test_no_essence_is_built_fetched_or_stored() -> None:
    body = kopf.Body({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "judge-0", "labels": {"a": "b"},
                                                                       "annotations": {"genrm.io/x": "y"}},
                      "spec": {"containers": [{"name": "engine"}]}, "status": {"phase": "Running"}})
    storage = NoDiffBase()
    built, fetched = storage.build(body=body, extra_fields=["status.phase"]), storage.fetch(body=body)
    assert built == {} and fetched == {}
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=kopf.BodyEssence({"spec": {"x": 1}}))
    assert not patch
