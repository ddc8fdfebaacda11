"""The peers contract (``genrm_contract.peers``) on both sides: what a ``PeersDocument`` admits, the
operator's client against a real gateway, and a key-protected pool's forwards.

Aspects: a document holds at most ``MAX_PEERS`` distinct IPv4 or IPv6 literals of unicast hosts with
a port, in canonical spelling, and nothing else (hostile values raise, so the gateway answers 400);
the operator writes pod IPs as such addresses; the loop tag is the pool's, never its token; the
operator's ``SidecarClient.peers`` gets back the document the gateway holds, the newer of two that
cross, and tells a server without the route apart; a replica of a key-protected pool forwards with
the pool's key, which its peer demands.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from genrm_contract.peers import FORWARDED_TO_HEADER, MAX_PEERS, PeersDocument, forward_tag, peer_address
from genrm_contract.sidecar import ENGINE_CONFIG_FILE, ENGINE_KEY_FILE
from genrm_gateway.apikey import write_engine_files
from genrm_operator.shell.sidecar import Endpoint, PeersUnknown, SidecarClient
from genrm_testing import CONTROL_TOKEN, run_gateway, run_sim
from pydantic import ValidationError


@pytest.mark.parametrize("peers", [
    (), ("10.0.0.1:8000",), ("[fd00::1]:8000", "10.0.0.1:1", "127.0.0.1:65535"),
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
    "10.0.0.1:8000\r\nhost: x", "10.0.0.1:80:80", "x" * 100,
])
def test_hostile_peers_are_refused(peer: str) -> None:
    with pytest.raises(ValidationError):
        PeersDocument.model_validate({"version": 1, "peers": [peer]})


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
    PeersDocument(version=1, peers=(peer_address("10.244.1.7", 8000), peer_address("fd00:10:244::7", 8000)))


def test_the_loop_tag_is_the_pools_and_never_its_token() -> None:
    assert forward_tag("a") == forward_tag("a") != forward_tag("b")
    assert "a-long-secret-token" not in forward_tag("a-long-secret-token")
    assert len(forward_tag("t")) == 32


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


def test_a_key_protected_replica_forwards_with_the_pools_key(tmp_path: Path) -> None:
    write_engine_files(tmp_path, "judge-key")
    engine = ("--config", str(tmp_path / ENGINE_CONFIG_FILE))
    keyed = ("--engine-api-key-file", str(tmp_path / ENGINE_KEY_FILE))
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
