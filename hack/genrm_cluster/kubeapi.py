"""A small synchronous Kubernetes REST client on httpx, working on plain dicts.

Why not the official client: the node agent only needs a handful of calls, and the official
client's model (de)serialisation costs noticeable CPU on a 2-core machine that also runs etcd,
the apiserver and the tests. Dicts also match what we patch into pod status one-to-one.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

JSON = dict[str, Any]


class ApiError(Exception):
    """A non-2xx answer from the apiserver."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


class KubeAPI:
    """Talks to one apiserver with a client certificate (as written by `ControlPlane`)."""

    def __init__(self, server: str, ca_file: Path, cert_file: Path, key_file: Path) -> None:
        self.server = server
        context = ssl.create_default_context(cafile=str(ca_file))
        context.load_cert_chain(str(cert_file), str(key_file))
        self._client = httpx.Client(
            base_url=server,
            verify=context,
            timeout=httpx.Timeout(30.0, connect=5.0),
        )

    def close(self) -> None:
        self._client.close()

    def request(
        self,
        method: str,
        path: str,
        body: JSON | None = None,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> JSON:
        """Send one request and return the decoded JSON answer; raise `ApiError` otherwise."""
        content = json.dumps(body).encode() if body is not None else None
        response = self._client.request(
            method, path, content=content, params=params, headers={"Content-Type": content_type}
        )
        if response.status_code >= 300:
            raise ApiError(response.status_code, response.text)
        result: JSON = response.json()
        return result

    def get(self, path: str, params: dict[str, str] | None = None) -> JSON:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: JSON) -> JSON:
        return self.request("POST", path, body)

    def patch(self, path: str, body: JSON, kind: str = "strategic-merge-patch") -> JSON:
        return self.request("PATCH", path, body, content_type=f"application/{kind}+json")

    def delete(self, path: str, body: JSON | None = None) -> JSON:
        return self.request("DELETE", path, body)

    def watch(
        self,
        path: str,
        resource_version: str,
        params: dict[str, str] | None = None,
        timeout_seconds: int = 300,
    ) -> Iterator[JSON]:
        """Yield watch events (`{"type": ..., "object": ...}`) until the server ends the stream."""
        params = {
            **(params or {}),
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        timeout = httpx.Timeout(timeout_seconds + 30.0, connect=5.0)
        with self._client.stream("GET", path, params=params, timeout=timeout) as response:
            if response.status_code >= 300:
                raise ApiError(response.status_code, response.read().decode(errors="replace"))
            for line in response.iter_lines():
                if line:
                    yield json.loads(line)
