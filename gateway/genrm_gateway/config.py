"""Gateway settings: where it listens, where its engine is, and what one client may cost it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from genrm_contract import limits as defaults
from genrm_contract import sidecar
from genrm_contract.peers import PEERS_VALID_SECONDS


@dataclass(frozen=True)
class EngineAddress:
    """Where an HTTP/1.1 server the gateway talks to listens: its loopback engine, or a peer
    replica's traffic port (`peers`)."""

    host: str
    port: int

    @classmethod
    def parse(cls, url: str) -> EngineAddress:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the engine URL must be http://host:port, got {url!r}")
        return cls(parts.hostname, parts.port or 80)

    @property
    def authority(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _limit(default: float, help: str) -> Any:
    """A limit's default and its one-line help (the CLI's ``--help`` and the chart read it)."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Limits:
    """What one client may cost the gateway; each refusal has its own status code and reason.

    Why these defaults: judge requests are small JSON documents sent by in-cluster trainers, so a
    64 KiB head, 100 headers and tens of seconds to deliver a body are far beyond any honest
    client, while they bound what a slow or hostile one can hold: memory (head, body, a stalled
    stream's buffer) and, as important here, in-flight slots that would keep a drain from ending.
    The keep-alive timeout is longer than common client pool expiries (httpx: 5 s) so that the
    server is not the side that races a client's reuse of an idle connection.
    """

    max_head_bytes: int = _limit(defaults.MAX_HEAD_BYTES, "request line plus headers larger than this get 431")
    max_headers: int = _limit(defaults.MAX_HEADERS, "more header fields than this get 431")
    head_timeout_seconds: float = _limit(defaults.HEAD_TIMEOUT_SECONDS, "a request head not complete this long after "
                                         "its first byte (or the connection's opening) gets 408")
    body_timeout_seconds: float = _limit(defaults.BODY_TIMEOUT_SECONDS, "an admitted request's body not complete "
                                         "within this gets 408 and leaves in-flight at once")
    max_body_bytes: int = _limit(sidecar.MAX_BODY_BYTES, "larger request bodies get 413")
    max_json_depth: int = _limit(defaults.MAX_JSON_DEPTH, "JSON bodies nesting deeper than this get 400")
    max_json_containers: int = _limit(defaults.MAX_JSON_CONTAINERS, "JSON bodies with more arrays and objects than "
                                      "this get 400")
    max_batch_size: int = _limit(defaults.MAX_BATCH_SIZE, "batched requests with more prompts (or request ids) than "
                                 "this get 400")
    max_connections: int = _limit(defaults.MAX_CONNECTIONS, "open traffic connections beyond this get 503 and are "
                                  "closed")
    write_timeout_seconds: float = _limit(defaults.WRITE_TIMEOUT_SECONDS, "a client that reads nothing of its response "
                                          "this long is cut and its engine request aborted")
    stream_buffer_bytes: int = _limit(1 << 20, "engine bytes buffered per response (streamed or not) before the "
                                      "gateway stops reading from the engine")
    keep_alive_seconds: float = _limit(defaults.KEEP_ALIVE_SECONDS, "idle keep-alive client connections close after "
                                       "this")
    max_connection_age_seconds: float = _limit(defaults.MAX_CONNECTION_AGE_SECONDS, "a client connection older than "
                                               "this (jittered by up to 10%% either way) is handed back: its next "
                                               "response carries Connection: close; 0 turns this off")
    engine_wait_seconds: float = _limit(defaults.ENGINE_WAIT_SECONDS, "a request that finds the engine unreachable "
                                        "and no peer replica to take it waits this long for it to come back (a "
                                        "restarted container) before a retryable 503; 0 answers at once")
    engine_head_timeout_seconds: float = _limit(defaults.ENGINE_HEAD_TIMEOUT_SECONDS, "an engine answer whose head has "
                                                "not come this long after the request was sent gets 504 (a "
                                                "non-streamed answer's head comes only when its generation ends)")
    engine_read_timeout_seconds: float = _limit(defaults.ENGINE_READ_TIMEOUT_SECONDS, "an engine answer that sends "
                                                "nothing more this long (while the gateway reads it) is ended: 504, or "
                                                "a cut stream")


@dataclass(frozen=True)
class GatewayConfig:
    host: str = "0.0.0.0"
    port: int = sidecar.TRAFFIC_PORT
    control_port: int = sidecar.CONTROL_PORT
    engine: EngineAddress = EngineAddress("127.0.0.1", 30000)
    limits: Limits = Limits()
    quiet_seconds: float = sidecar.QUIET_SECONDS
    propagation_seconds: float = sidecar.PROPAGATION_SECONDS
    engine_poll_seconds: float = 1.0
    engine_api_key: str | None = field(default=None, repr=False)
    """SGLang's ``--api-key``: sent on every engine call and demanded from judge clients (``apikey``)."""
    peers_valid_seconds: float = PEERS_VALID_SECONDS
    """How long the peers stay in use after the operator's last control call (``peers``); tests shorten it."""
    loopback_peers: bool = False
    """Accept loopback peer addresses: for tests only, which run every replica on one host."""
    judge_revision: str = ""
    """The replica's judge revision, sent as ``x-genrm-revision`` on every answer ('' sends none)."""

    def response_headers(self) -> list[tuple[str, str]]:
        """Headers on every answer the gateway gives: the judge revision's, when it has one."""
        return [(sidecar.REVISION_HEADER, self.judge_revision)] if self.judge_revision else []
