"""The address policy of imports (platform/adapters/imports/ssrf.py, fetch.py): which addresses are refused,
names resolved once and the checked address connected to, redirects checked hop by hop, and the allow-list the
other import tests rely on (without it, their local servers are refused)."""

from __future__ import annotations

import asyncio
import ipaddress
from pathlib import Path

import pytest

from loraplex.platform.adapters.imports.fetch import Budget, Fetcher, SourceError
from loraplex.platform.adapters.imports.ssrf import AddressPolicy, AddressRefused, parse_networks, refused_reason
from tests.platform.helpers import free_port
from tests.platform.import_sources import Reply, self_signed, source_server

REFUSED = [
    "127.0.0.1",
    "127.8.9.10",
    "0.0.0.0",
    "10.1.2.3",
    "172.16.0.1",
    "192.168.1.1",
    "100.64.0.1",
    "169.254.169.254",
    "169.254.1.1",
    "224.0.0.1",
    "240.0.0.1",
    "::1",
    "::",
    "fe80::1",
    "fc00::1",
    "fd00:ec2::254",
    "ff02::1",
    "::ffff:127.0.0.1",
    "::ffff:169.254.169.254",
    "::ffff:10.0.0.1",
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
]
PUBLIC = ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8"]


@pytest.mark.parametrize("address", REFUSED)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert refused_reason(ipaddress.ip_address(address)) is not None
    with pytest.raises(AddressRefused):
        AddressPolicy().resolve(address, 443)


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_pass(address: str) -> None:
    assert refused_reason(ipaddress.ip_address(address)) is None
    assert AddressPolicy().resolve(address, 443) == ipaddress.ip_address(address)


def test_the_allow_list_opens_what_it_names_and_nothing_else() -> None:
    policy = AddressPolicy(parse_networks("127.0.0.1/32, 10.9.0.0/16"))
    assert str(policy.resolve("127.0.0.1", 80)) == "127.0.0.1"
    assert str(policy.resolve("10.9.8.7", 80)) == "10.9.8.7"
    for address in ("127.0.0.2", "10.8.0.1", "::1", "[::1]", "::ffff:127.0.0.1"):
        with pytest.raises(AddressRefused):
            policy.resolve(address, 80)
    # a broad allow-list never opens the metadata address (only naming it exactly does)
    broad = AddressPolicy(parse_networks("169.254.0.0/16"))
    assert str(broad.resolve("169.254.1.1", 80)) == "169.254.1.1"
    with pytest.raises(AddressRefused, match="metadata"):
        broad.resolve("169.254.169.254", 80)
    with pytest.raises(ValueError, match="import_allow_networks"):
        parse_networks("127.0.0.1/33")


def test_names_are_resolved_and_every_address_checked() -> None:
    names = {"metadata.test": ["169.254.169.254"], "mixed.test": ["93.184.216.34", "10.0.0.1"]}
    policy = AddressPolicy(resolver=lambda host, port: names[host])
    with pytest.raises(AddressRefused, match=r"metadata\.test resolves to 169\.254\.169\.254"):
        policy.resolve("metadata.test", 443)
    with pytest.raises(AddressRefused, match=r"10\.0\.0\.1"):
        policy.resolve("mixed.test", 443)
    with pytest.raises(AddressRefused, match="localhost resolves to"):  # the system's resolver
        AddressPolicy().resolve("localhost", 443)


def _get(policy: AddressPolicy, url: str, headers: dict[str, str] | None = None) -> bytes:
    async def run() -> bytes:
        fetcher = Fetcher(policy, allow_http=True)
        try:
            response = await fetcher.open(url, headers)
            body = await response.aread()
            await response.aclose()
            return body
        finally:
            await fetcher.close()

    return asyncio.run(run())


def test_local_servers_are_refused_without_the_allow_list() -> None:
    with source_server() as server:
        server.routes["/a.zip"] = Reply(200, b"zip")
        with pytest.raises(SourceError) as caught:
            _get(AddressPolicy(), f"{server.url}/a.zip")
        assert caught.value.code == "source_address_refused" and not caught.value.transient
        assert server.paths() == []  # refused before connecting
        assert _get(AddressPolicy(parse_networks("127.0.0.1")), f"{server.url}/a.zip") == b"zip"


def test_the_checked_address_is_the_one_connected_to() -> None:
    """A name is resolved once per hop; the request goes to that address with the name as its Host."""
    calls: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        calls.append(host)
        return ["127.0.0.1"] if len(calls) == 1 else ["169.254.169.254"]  # a rebinding second answer

    with source_server() as server:
        server.routes["/a.zip"] = Reply(200, b"zip")
        policy = AddressPolicy(parse_networks("127.0.0.1"), resolver=resolver)
        assert _get(policy, f"http://adapters.test:{server.port}/a.zip") == b"zip"
        assert calls == ["adapters.test"]
        assert server.seen[0].headers["host"] == f"adapters.test:{server.port}"


@pytest.mark.parametrize(
    "target",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:{port}/a.zip",
        "http://10.0.0.1/a.zip",
        "http://[::ffff:127.0.0.1]:{port}/a.zip",
        "http://internal.test:{port}/a.zip",  # a name that resolves to a refused address
        "http://127.0.0.2:{port}/a.zip",
    ],
)
def test_every_redirect_hop_is_checked(target: str) -> None:
    policy = AddressPolicy(parse_networks("127.0.0.1"), resolver=lambda host, port: ["127.0.0.2"])
    with source_server() as server:
        server.routes["/start.zip"] = Reply(302, headers={"Location": target.format(port=server.port)})
        server.routes["/a.zip"] = Reply(200, b"secret")
        with pytest.raises(SourceError) as caught:
            _get(policy, f"{server.url}/start.zip")
        assert caught.value.code == "source_address_refused", caught.value.message
        assert server.paths() == ["/start.zip"]


def test_redirects_to_allowed_hosts_are_followed_and_credentials_stay_on_their_host() -> None:
    policy = AddressPolicy(parse_networks("127.0.0.1"), resolver=lambda host, port: ["127.0.0.1"])
    with source_server() as server:
        server.routes["/start.zip"] = Reply(302, headers={"Location": "/same.zip"})
        server.routes["/same.zip"] = Reply(307, headers={"Location": f"http://cdn.test:{server.port}/a.zip"})
        server.routes["/a.zip"] = Reply(200, b"zip")
        assert _get(policy, f"{server.url}/start.zip", {"Authorization": "Bearer hf_secret"}) == b"zip"
        assert server.paths() == ["/start.zip", "/same.zip", "/a.zip"]
        sent = [s.headers.get("authorization") for s in server.seen]
        assert sent == ["Bearer hf_secret", "Bearer hf_secret", None]


def test_plain_http_needs_its_setting() -> None:
    with source_server() as server:
        server.routes["/a.zip"] = Reply(200, b"zip")

        async def run() -> None:
            fetcher = Fetcher(AddressPolicy(parse_networks("127.0.0.1")), allow_http=False)
            try:
                await fetcher.open(f"{server.url}/a.zip")
            finally:
                await fetcher.close()

        with pytest.raises(SourceError, match="plain http") as caught:
            asyncio.run(run())
        assert caught.value.code == "invalid_source" and server.paths() == []


def test_a_download_stops_at_the_byte_budget_while_streaming(tmp_path: Path) -> None:
    with source_server() as server:
        server.routes["/big.zip"] = Reply(stream_bytes=64 << 20)  # no Content-Length: counted as it arrives

        async def run() -> None:
            fetcher = Fetcher(AddressPolicy(parse_networks("127.0.0.1")), allow_http=True)
            try:
                await fetcher.download(f"{server.url}/big.zip", tmp_path / "big.zip", Budget(256 << 10), _no_progress)
            finally:
                await fetcher.close()

        with pytest.raises(SourceError) as caught:
            asyncio.run(run())
        assert caught.value.code == "source_too_large"
        assert (tmp_path / "big.zip").stat().st_size <= 256 << 10
        _wait(lambda: "/big.zip" in server.sent)
        assert server.sent["/big.zip"] < 64 << 20  # the client hung up long before the end


def _no_progress(done: int, total: int | None) -> None:
    pass


def _wait(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_transient_and_permanent_answers(tmp_path: Path) -> None:
    policy = AddressPolicy(parse_networks("127.0.0.1"))
    with source_server() as server:
        for status in (500, 503, 429, 404, 403):
            server.routes[f"/{status}.zip"] = Reply(status)
        for status in (500, 503, 429, 404, 403):
            with pytest.raises(SourceError) as caught:
                _get(policy, f"{server.url}/{status}.zip")
            assert caught.value.transient == (status >= 500 or status == 429), status
            assert caught.value.code == ("source_unreachable" if caught.value.transient else "source_error")
    port = free_port()  # nothing listens there
    with pytest.raises(SourceError) as caught:
        _get(policy, f"http://127.0.0.1:{port}/gone.zip")
    assert caught.value.transient and caught.value.code == "source_unreachable"


def test_https_connects_to_the_checked_address_and_verifies_the_name(tmp_path: Path) -> None:
    """Over TLS the connection goes to the checked address while the certificate is checked against the URL's name
    (sent as SNI): a certificate for another name is refused."""
    server_tls, trusted = self_signed(tmp_path, "adapters.test")
    policy = AddressPolicy(parse_networks("127.0.0.1"), resolver=lambda host, port: ["127.0.0.1"])

    async def get(url: str) -> bytes:
        fetcher = Fetcher(policy, allow_http=False, verify=trusted)
        try:
            response = await fetcher.open(url)
            body = await response.aread()
            await response.aclose()
            return body
        finally:
            await fetcher.close()

    with source_server(server_tls) as server:
        server.routes["/a.zip"] = Reply(200, b"zip over tls")
        assert asyncio.run(get(f"https://adapters.test:{server.port}/a.zip")) == b"zip over tls"
        assert server.seen[0].headers["host"] == f"adapters.test:{server.port}"
        with pytest.raises(SourceError) as caught:
            asyncio.run(get(f"https://other.test:{server.port}/a.zip"))
        assert "TLS certificate refused" in caught.value.message
        assert caught.value.code == "source_error" and not caught.value.transient  # not retried
