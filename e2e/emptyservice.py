"""The moments a Service has no ready endpoint, as its EndpointSlices say (what kube-proxy follows).

Why: while a Service lists no ready endpoint, kube-proxy rejects its clients' connections, so a
request sent then is lost whatever the replicas do; the soak attributes every lost request to an
engine crash it was in flight at, to such a moment, or to neither, and needs the moments for that.
A watch (not a poll) sees a moment however short it is; each event is stamped with
`time.monotonic()` on arrival, the clock the clients stamp their failures with.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

WATCH_SECONDS = 5
"""Each watch call ends after this long (server side), so a stop is seen within it."""
GONE = 410
"""The watch's resourceVersion is too old: list again."""


@dataclass(frozen=True)
class Moment:
    """One stretch without a ready endpoint: from ``start`` to ``end`` (None: not over yet)."""

    start: float
    end: float | None

    def seconds(self, until: float) -> float:
        return (until if self.end is None else self.end) - self.start

    def overlaps(self, start: float, end: float) -> bool:
        """Whether it meets the span from ``start`` to ``end``."""
        return self.start <= end and (self.end is None or self.end >= start)


def ready_endpoints(endpoint_slice: Any) -> int:
    """Addresses of the slice's ready endpoints (an absent ``ready`` condition means ready)."""
    return sum(len(e.addresses or []) for e in endpoint_slice.endpoints or []
               if e.conditions is None or e.conditions.ready is not False)


class EmptyServiceWatch:
    """Watches the EndpointSlices of Service ``namespace/service`` from entry to exit and keeps its
    empty moments (see the module docstring); a context manager."""

    def __init__(self, api: client.ApiClient, namespace: str, service: str) -> None:
        self._discovery = client.DiscoveryV1Api(api)
        self.namespace, self.selector = namespace, f"kubernetes.io/service-name={service}"
        self._ready: dict[str, int] = {}
        self._version: str | None = None
        self._moments: list[Moment] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._watch, name=f"empty-{service}", daemon=True)

    def __enter__(self) -> EmptyServiceWatch:
        self._version = self._resume(self._list())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * WATCH_SECONDS)

    def moments(self) -> list[Moment]:
        """The moments seen; raises if the watch broke down (moments after that would be missing)."""
        if self._failed is not None:
            raise RuntimeError(f"the EndpointSlice watch of {self.selector} failed") from self._failed
        with self._lock:
            return list(self._moments)

    def _watch(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # re-raised by moments(), in the test's thread
            self._failed = exc

    def _run(self) -> None:
        version = self._version
        while not self._stop.is_set():
            try:
                version = version or self._resume(self._list())
                for event in watch.Watch().stream(
                        self._discovery.list_namespaced_endpoint_slice, self.namespace, label_selector=self.selector,
                        resource_version=version, timeout_seconds=WATCH_SECONDS):
                    if event["type"] == "ERROR":
                        version = None
                        break
                    found = event["object"]
                    version = found.metadata.resource_version
                    self._seen(found.metadata.name, 0 if event["type"] == "DELETED" else ready_endpoints(found))
                    if self._stop.is_set():
                        return
            except ApiException as exc:
                if exc.status == GONE:
                    version = None
                else:
                    self._stop.wait(0.2)
            except HTTPError:  # the apiserver connection broke: watch again from where it was
                self._stop.wait(0.2)

    def _list(self) -> Any:
        return self._discovery.list_namespaced_endpoint_slice(self.namespace, label_selector=self.selector)

    def _resume(self, listed: Any) -> str:
        """Take a list's slices as the whole truth; its resourceVersion, to watch from."""
        with self._lock:
            self._ready = {s.metadata.name: ready_endpoints(s) for s in listed.items}
        self._changed()
        return str(listed.metadata.resource_version)

    def _seen(self, name: str, ready: int) -> None:
        with self._lock:
            self._ready[name] = ready
        self._changed()

    def _changed(self) -> None:
        now = time.monotonic()
        with self._lock:
            empty = not any(self._ready.values())
            open_moment = self._moments[-1] if self._moments and self._moments[-1].end is None else None
            if empty and open_moment is None:
                self._moments.append(Moment(now, None))
            elif not empty and open_moment is not None:
                self._moments[-1] = Moment(open_moment.start, now)
