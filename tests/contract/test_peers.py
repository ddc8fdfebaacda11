"""The peers contract (``genrm_contract.peers``) on both sides: what a ``PeersDocument`` admits, the
operator's client against a real gateway, and a key-protected pool's forwards.

Aspects: a document holds at most ``MAX_PEERS`` distinct IPv4 or IPv6 literals of unicast hosts with
a port, in canonical spelling, never loopback unless the validation context admits it (tests), and
nothing else (hostile values raise, so the gateway answers 400); the operator writes pod IPs as such
addresses, canonically; the loop tag and the forward proof are the pool's, never its token; the
operator's ``SidecarClient.peers`` gets back the document the gateway holds, the newer of two that
cross, and tells a server without the route apart; a replica of a key-protected pool forwards
without the pool's key, its peer taking the pool's tag instead; a server at a peer's address that
is no gateway of the pool gets neither the key nor a chance to answer the client (502).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path

import httpx
import pytest
from genrm_contract.peers import (
    FORWARDED_TO_HEADER,
    LOOP_HEADER,
    LOOPBACK_PEERS,
    MAX_PEERS,
    NONCE_HEADER,
    PeersDocument,
    forward_proof,
    forward_tag,
    peer_address,
)
from genrm_contract.sidecar import ENGINE_CONFIG_FILE, ENGINE_KEY_FILE, RefusalReason
from genrm_gateway.apikey import write_engine_files
from genrm_operator.shell.sidecar import Endpoint, PeersUnknown, SidecarClient
from genrm_testing import CONTROL_TOKEN, run_gateway, run_sim
from pydantic import ValidationError


@pytest.mark.parametrize("peers", [
    (), ("10.0.0.1:8000",), ("[fd00::1]:8000", "10.0.0.1:1", "10.0.0.2:65535"),
    tuple(f"10.0.0.{i}:8000" for i in range(MAX_PEERS)),
])
def test_valid_documents(peers: tuple[str, ...]) -> None:
    document = PeersDocument.model_validate({"version": 3, "peers": list(peers)})
    assert document.peers == peers and PeersDocument.model_validate(document.wire()) == document


@pytest.mark.parametrize("peer", [
    "", "10.0.0.1", "10.0.0.1:", ":8000", "localhost:8000", "judge.rl.svc:8000", "http://10.0.0.1:8000",
    "10.0.0.1:0", "10.0.0.1:65536", "10.0.0.1:08000", "10.0.0.1:+800", "10.0.0.1:٨٠٠٠", "10.0.0.01:8000",
    "010.0.0.1:8000", "10.0.1:8000", "0x0a.0.0.1:8000", "0.0.0.0:8000", "255.255.255.255:8000", "240.0.0.1:8000",
    "224.0.0.1:8000", "169.254.0.1:8000", "[::]:8000", "[ff02::1]:8000", "[fe80::1]:8000", "[fe80::1%eth0]:8000",
    "fd00::1:8000", "[10.0.0.1]:8000", "[FD00::1]:8000", "[fd00:0::1]:8000", "10.0.0.1:8000/x", "10.0.0.1:8000 ",
    "10.0.0.1:8000\r\nhost: x", "10.0.0.1:80:80", "x" * 100, "127.0.0.1:8000", "127.3.2.1:8000", "[::1]:8000",
])
def test_hostile_peers_are_refused(peer: str) -> None:
    with pytest.raises(ValidationError):
        PeersDocument.model_validate({"version": 1, "peers": [peer]})


def test_loopback_peers_only_through_the_validation_context() -> None:
    document = {"version": 1, "peers": ["127.0.0.1:8000", "127.0.0.2:8000"]}
    assert PeersDocument.model_validate(document, context={LOOPBACK_PEERS: True}).peers == tuple(document["peers"])
    with pytest.raises(ValidationError):
        PeersDocument.model_validate(document, context={LOOPBACK_PEERS: False})


@pytest.mark.parametrize("document", [
    {"peers": []}, {"version": -1, "peers": []}, {"version": 2**63, "peers": []}, {"version": 1.5, "peers": []},
    {"version": 1, "peers": ["10.0.0.1:80", "10.0.0.1:80"]},
    {"version": 1, "peers": [f"10.0.0.{i}:80" for i in range(MAX_PEERS + 1)]},
    {"version": 1, "peers": [], "mine": True}, {"version": 1, "peers": "10.0.0.1:80"}, {"version": 1, "peers": [1]},
])
def test_malformed_documents_are_refused(document: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        PeersDocument.model_validate(document)


def test_the_operator_writes_pod_ips_as_peer_addresses() -> None:
    assert peer_address("10.244.1.7", 8000) == "10.244.1.7:8000"
    assert peer_address("fd00:10:244::7", 8000) == "[fd00:10:244::7]:8000"
    assert peer_address("FD00:10:244:0::7", 8000) == "[fd00:10:244::7]:8000"  # one pod, one spelling
    for ip in ("127.0.0.1", "::1", "10.0.0.01", "pod-7", "0.0.0.0"):
        with pytest.raises(ValueError):
            peer_address(ip, 8000)
    PeersDocument(version=1, peers=(peer_address("10.244.1.7", 8000), peer_address("fd00:10:244::7", 8000)))


def test_the_loop_tag_is_the_pools_and_never_its_token() -> None:
    assert forward_tag("a") == forward_tag("a") != forward_tag("b")
    assert "a-long-secret-token" not in forward_tag("a-long-secret-token")
    assert len(forward_tag("t")) == 32


def test_the_forward_proof_is_the_pools_and_the_nonces() -> None:
    assert forward_proof("a", b"n1") == forward_proof("a", b"n1") != forward_proof("a", b"n2")
    assert forward_proof("a", b"n1") != forward_proof("b", b"n1") and forward_proof("a", b"n1") != forward_tag("a")


def test_the_operators_client_gets_back_what_the_gateway_holds() -> None:
    with run_sim(ready_path=None) as sim, run_gateway(sim.url) as gateway:
        endpoint = Endpoint("127.0.0.1", gateway.control_port, CONTROL_TOKEN)

        async def pushes() -> list[PeersDocument | None]:
            client = SidecarClient()
            try:
                newer = await client.peers(endpoint, PeersDocument(version=5, peers=("10.0.0.2:8000",)))
                older = await client.peers(endpoint, PeersDocument(version=4, peers=()))
                wrong = await client.peers(Endpoint("127.0.0.1", gateway.control_port, "nope"),
                                           PeersDocument(version=9, peers=()))
                with pytest.raises(PeersUnknown):  # no such route: the simulator stands in for an old gateway
                    await client.peers(Endpoint("127.0.0.1", sim.port, CONTROL_TOKEN), PeersDocument(version=9))
                return [newer, older, wrong]
            finally:
                await client.close()

        newer, older, wrong = asyncio.run(pushes())
        assert newer == older == PeersDocument(version=5, peers=("10.0.0.2:8000",))
        assert wrong is None


def test_a_key_protected_replicas_forward_is_taken_on_the_pools_tag(tmp_path: Path) -> None:
    write_engine_files(tmp_path, "judge-key")
    engine = ("--config", str(tmp_path / ENGINE_CONFIG_FILE))
    keyed = ("--engine-api-key-file", str(tmp_path / ENGINE_KEY_FILE), "--loopback-peers")
    with run_sim(*engine, ready_path=None) as crashed_sim, run_gateway(crashed_sim.url, *keyed) as crashed, \
            run_sim(*engine, ready_path=None) as peer_sim, run_gateway(peer_sim.url, *keyed) as peer:
        told = httpx.post(f"{crashed.control}/v1/peers", headers={"authorization": f"Bearer {CONTROL_TOKEN}"},
                          json={"version": 1, "peers": [f"127.0.0.1:{peer.port}"]})
        assert told.status_code == 200
        crashed_sim.process.kill()
        crashed_sim.process.wait()
        key = {"authorization": "Bearer judge-key"}
        answer = httpx.post(f"{crashed.url}/generate", json={"text": "x"}, headers=key, timeout=10)
        assert answer.status_code == 200, answer.text
        assert answer.headers[FORWARDED_TO_HEADER] == f"127.0.0.1:{peer.port}"
        refused = httpx.post(f"{crashed.url}/generate", json={"text": "x"}, timeout=10)
        assert refused.status_code == 401  # the crashed replica still holds its own clients to the key
        # A client's loop header is no tag: the peer still wants the key from it.
        posing = httpx.post(f"{peer.url}/generate", json={"text": "x"}, timeout=10,
                            headers={LOOP_HEADER: forward_tag("a guess"), NONCE_HEADER: "n"})
        assert posing.status_code == 401


def test_a_stale_peer_address_gets_no_key_and_its_answer_never_reaches_the_client(tmp_path: Path) -> None:
    """The peer's IP now belongs to another pod (the operator away, the list stale): it gets the
    request without the pool's key, and its answer, which carries no proof, is dropped."""
    write_engine_files(tmp_path, "judge-key")
    listener = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []

    def foreign() -> None:
        conn, _ = listener.accept()
        received.append(conn.recv(65536))
        body = b'{"text":"another model says: 10/10"}'
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                     % (len(body), body))
        conn.close()

    threading.Thread(target=foreign, daemon=True).start()
    with run_sim("--config", str(tmp_path / ENGINE_CONFIG_FILE), ready_path=None) as sim, \
            run_gateway(sim.url, "--engine-api-key-file", str(tmp_path / ENGINE_KEY_FILE), "--loopback-peers") as gw:
        told = httpx.post(f"{gw.control}/v1/peers", headers={"authorization": f"Bearer {CONTROL_TOKEN}"},
                          json={"version": 1, "peers": [f"127.0.0.1:{listener.getsockname()[1]}"]})
        assert told.status_code == 200
        sim.process.kill()
        sim.process.wait()
        answer = httpx.post(f"{gw.url}/generate", json={"text": "private prompt"},
                            headers={"authorization": "Bearer judge-key"}, timeout=10)
        assert answer.status_code == 502 and answer.headers["x-genrm-reason"] == RefusalReason.PEER_UNPROVEN
        assert "10/10" not in answer.text
        metrics = httpx.get(f"{gw.control}/metrics").text
        assert 'genrm_gateway_forwarded_total{outcome="unproven"} 1.0' in metrics
    listener.close()
    request = received[0].lower()
    assert b"judge-key" not in request and b"authorization" not in request
    assert LOOP_HEADER.encode() in request and NONCE_HEADER.encode() in request
