"""The activators (`genrm_contract.activator`): where they are, what they hold, what they were told.

One fleet per operator, shared by every pool's reconciler. Where: the endpoints of the activator's
Service, read every :data:`REFRESH_SECONDS` (the operator needs them only for pools that may go to
zero, so a list call every few seconds beats a cluster-wide watch). Only ready ones stand in for a
pool; terminating ones are still followed and told the routes, because a stopping activator keeps
what it holds until a replica serves (`genrm_gateway.activator`), and only a route tells it one does. What they hold:
one long poll per activator, as for the gateways, waking the reconciler of every pool whose held
count changed, so a request at zero wakes its pool at once. What they were told: each pool's route,
pushed with an idempotent ``PUT`` when it changed or the activator restarted (a new boot id).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote

import aiohttp
from genrm_contract.activator import ROUTES_PATH, ActivatorState, PoolRoute
from genrm_contract.demand import DemandHint
from genrm_contract.sidecar import CONTROL_PORT_NAME, STATE_PATH, TRAFFIC_PORT_NAME, WAIT_PARAM
from pydantic import ValidationError

from ..core.model import ActivatorView
from .kube import Kube

log = logging.getLogger(__name__)
REFRESH_SECONDS = 2.0
WAIT_SECONDS = 30.0
RETRY_SECONDS = 1.0


@dataclass
class _Activator:
    address: str
    """Its pod IP."""
    control: str
    """``http://ip:port`` of its control port."""
    task: asyncio.Task[None] | None = None
    state: ActivatorState | None = None
    pushed: dict[str, PoolRoute | None] = field(default_factory=dict)
    """The route each pool was last given, under the boot id it was given to."""
    boot_id: str | None = None
    ready: bool = True
    """False once it terminates: followed and told the routes still, but no pool's stand-in."""


class ActivatorFleet:
    """The operator's view of the activators, and its one channel to them."""

    def __init__(self, kube: Kube, namespace: str, service: str, token: str,
                 wake: Callable[[str | None], None]) -> None:
        """``wake(key)`` wakes the reconciler of the pool ``namespace/name`` (when it runs one), ``wake(None)``
        every pool's (an activator (re)started and needs their routes)."""
        self.kube, self.namespace, self.service = kube, namespace, service
        self._headers = {"Authorization": f"Bearer {token}"}
        self._wake = wake
        self._traffic_port = 0
        self._activators: dict[str, _Activator] = {}
        self._session: aiohttp.ClientSession | None = None

    def view(self, key: str) -> ActivatorView:
        """The ready activators that have the pool ``key``'s route, and their traffic port: only those
        may stand in for the pool's replicas (another would answer its clients ``404 unknownPool``)."""
        known = sorted(a.address for a in self._activators.values()
                       if a.ready and key in a.pushed and a.pushed[key] is not None)
        return ActivatorView(tuple(known), self._traffic_port)

    def held(self, key: str) -> int:
        """Requests the activators hold for the pool ``key``."""
        return sum(a.state.held.get(key, 0) for a in self._activators.values() if a.state is not None)

    def hints(self, key: str) -> tuple[DemandHint, ...]:
        """Demand hints sent to the pool ``key`` through the activators (while it was at zero)."""
        return tuple(h for a in self._activators.values() if a.state is not None for h in a.state.demand.get(key, ()))

    async def run(self) -> None:
        """Keep the activators' addresses current and follow each one's state, until cancelled."""
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_SECONDS + 10))
        try:
            failed = ""
            while True:
                try:
                    await self._refresh()
                    failed = ""
                except Exception as exc:  # a failed list keeps the last known activators; say why, once
                    if str(exc) != failed:
                        log.warning("activators of %s/%s not listed: %s", self.namespace, self.service, exc)
                    failed = str(exc)
                await asyncio.sleep(REFRESH_SECONDS)
        finally:
            for activator in self._activators.values():
                if activator.task is not None:
                    activator.task.cancel()
            await self._session.close()

    async def _refresh(self) -> None:
        slices = await self.kube.endpoint_slices(self.namespace, self.service)
        listed: dict[str, bool] = {}  # address -> ready (False: terminating)
        traffic = control = 0
        for piece in slices:
            ports = {p.get("name"): p.get("port") for p in piece.get("ports") or []}
            traffic, control = ports.get(TRAFFIC_PORT_NAME) or traffic, ports.get(CONTROL_PORT_NAME) or control
            for endpoint in piece.get("endpoints") or []:
                conditions = endpoint.get("conditions") or {}
                if conditions.get("ready") or conditions.get("terminating"):
                    listed |= dict.fromkeys(endpoint.get("addresses") or [], bool(conditions.get("ready")))
        self._traffic_port = traffic
        wanted = {f"http://{a}:{control}": a for a in listed} if traffic and control else {}
        for gone in set(self._activators) - set(wanted):
            if (task := self._activators.pop(gone).task) is not None:
                task.cancel()
            self._wake(None)  # the pools it stood in for drop it from their slices
        for url, address in wanted.items():
            if (known := self._activators.get(url)) is None:
                activator = self._activators[url] = _Activator(address, url, ready=listed[address])
                activator.task = asyncio.ensure_future(self._follow(activator))
            elif known.ready != listed[address]:
                known.ready = listed[address]
                self._wake(None)  # stopping (or ready again): the pools' slices follow

    async def _follow(self, activator: _Activator) -> None:
        """Long-poll one activator's state; wake the pools whose held count changed."""
        assert self._session is not None
        while True:
            version = activator.state.version if activator.state is not None else None
            params = {} if version is None else {"version": str(version), WAIT_PARAM: str(WAIT_SECONDS)}
            try:
                async with self._session.get(activator.control + STATE_PATH, params=params,
                                             headers=self._headers) as answer:
                    state = ActivatorState.model_validate_json(await answer.read())
            except (aiohttp.ClientError, TimeoutError, ValidationError) as exc:
                log.debug("activator %s: state not read: %s", activator.control, exc)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            old = activator.state
            activator.state = state
            if state.boot_id != activator.boot_id:
                activator.boot_id, activator.pushed = state.boot_id, {}  # (re)started: it knows no route
                self._wake(None)
            before = old or ActivatorState(boot_id="", version=0)
            for key in set(state.held) | set(before.held) | set(state.demand) | set(before.demand):
                if before.held.get(key) != state.held.get(key) or before.demand.get(key) != state.demand.get(key):
                    self._wake(key)

    async def push(self, key: str, route: PoolRoute | None) -> None:
        """Give every activator the pool's route (None: remove it), where it differs from what it has."""
        if self._session is None:
            return
        namespace, name = key.split("/", 1)
        path = f"{ROUTES_PATH}/{quote(namespace, safe='')}/{quote(name, safe='')}"
        for activator in list(self._activators.values()):
            known = key in activator.pushed
            if activator.boot_id is None or (known and activator.pushed[key] == route) or (route is None and not known):
                continue
            try:
                if route is None:
                    async with self._session.delete(activator.control + path, headers=self._headers) as answer:
                        ok = answer.status == 200
                else:
                    async with self._session.put(activator.control + path, json=route.wire(),
                                                 headers=self._headers) as answer:
                        ok = answer.status == 200
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.info("activator %s: route of %s not pushed: %s", activator.control, key, exc)
                continue
            if ok and route is None:
                activator.pushed.pop(key, None)
            elif ok:
                if not known:
                    self._wake(key)  # it can stand in for the pool now: the next step may list it
                activator.pushed[key] = route
