"""uvicorn with a SIGTERM policy: the first signal runs the process's own way of stopping, then exits.

Why: the kubelet sends SIGTERM as a pod is deleted (after the preStop hook, or alone: a hook that
failed, a kubectl delete with a short grace period), while clients may still be routed to the pod
and requests are still being answered; uvicorn's own handling stops accepting at once. Each
process says how it stops (`StoppingServer.stop`): the sidecar drains (`server.GatewayServer`), the
activator keeps what it holds (`activator.ActivatorServer`). A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import sys
from types import FrameType
from typing import Any

import uvicorn


class StoppingServer(uvicorn.Server):
    """uvicorn whose first exit signal runs `stop` and then exits; see the module docstring."""

    def __init__(self, config: uvicorn.Config, name: str) -> None:
        super().__init__(config)
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self, sockets: list[Any] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._stopping or self._loop is None:
            self.force_exit = self.should_exit = True
            return
        self._stopping = True
        print(f"{self.name}: signal {sig}: draining before exit", file=sys.stderr, flush=True)
        self._loop.call_soon_threadsafe(self._start_stop)

    def _start_stop(self) -> None:
        task = asyncio.ensure_future(self._stop_then_exit())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _stop_then_exit(self) -> None:
        await self.stop()
        self.should_exit = True

    async def stop(self) -> None:
        """What happens between the first signal and the exit."""
        raise NotImplementedError
