"""A kube-proxy stand-in on loopback: a TCP balancer that picks a backend per connection.

Why here: behind a Kubernetes Service, kube-proxy places connections, not requests, and keeps a
connection on the backend it picked; tests of what clients see while replicas drain (the gateway's
plain-clients test, the trainer client's) need exactly that, over real gateway processes. Moved from
``tests/gateway/test_plain_clients.py`` so both use one balancer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from genrm_testing import free_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextmanager
def serving(handler: Handler, port: int) -> Iterator[None]:
    """A TCP server on a loopback port, run by its own event loop in a thread.

    On exit every connection task is cancelled and awaited before the loop closes: tasks left
    pending would be destroyed later by the garbage collector, at an arbitrary moment of the test run.
    """
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop = asyncio.Event()

    async def main() -> None:
        server = await asyncio.start_server(handler, "127.0.0.1", port)
        started.set()
        await stop.wait()
        server.close()
        current = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    thread.start()
    started.wait(10)
    try:
        yield
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


@dataclass
class Balancer:
    """A TCP balancer that picks a published backend per connection, round robin; ``sent`` keeps the
    bytes each client connection sent (for tests that read what went on the wire)."""

    published: list[int]
    port: int = field(default_factory=free_port)
    picks: dict[int, int] = field(default_factory=dict)
    sent: list[bytearray] = field(default_factory=list)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    record: bytearray | None = None) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if record is not None:
                    record += data
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _connect(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        backend = self.published[next(self._turn) % len(self.published)]
        self.picks[backend] = self.picks.get(backend, 0) + 1
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", backend)
        except OSError:
            client_writer.close()
            return
        record = bytearray()
        self.sent.append(record)
        await asyncio.gather(self._pipe(client_reader, upstream_writer, record),
                             self._pipe(upstream_reader, client_writer))

    def __post_init__(self) -> None:
        self._turn = itertools.count()

    def unpublish(self, backend: int) -> None:
        self.published = [port for port in self.published if port != backend]

    @contextmanager
    def running(self) -> Iterator[Balancer]:
        """Serve on :attr:`port` for the block."""
        with serving(self._connect, self.port):
            yield self
