"""The address policy of every connection an import makes (server-side request forgery): a host name is resolved
once, every address it resolves to is checked, and the connection goes to that checked address (the URL's host
kept as the Host header and TLS server name), so a second resolution cannot swap in another address. Loopback,
link-local, private, unique-local, multicast, reserved, unspecified and cloud metadata addresses are refused
(IPv4-mapped IPv6 judged as the IPv4 address it maps) unless the operator's allow-list names them."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]  # (host, port) -> addresses as text

# Cloud metadata services: link-local or unique-local already, named so a broad allow-list never opens them.
METADATA = frozenset(ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200"))


class AddressRefused(Exception):
    """The host is, or resolves to, an address the policy refuses (or does not resolve at all)."""


def system_resolver(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for `host` (the default; tests map names through their own)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise AddressRefused(f"host {host!r} does not resolve ({exc.strerror})") from None
    return [str(info[4][0]) for info in infos]


def parse_networks(text: str | Iterable[str]) -> list[Network]:
    """The allow-list setting: CIDRs or single addresses, comma separated (a ValueError naming a bad one)."""
    items = [t.strip() for t in (text.split(",") if isinstance(text, str) else text)]
    networks = []
    for item in items:
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"import_allow_networks: {item!r} is not an address or CIDR network") from None
    return networks


def refused_reason(address: IPAddress) -> str | None:
    """Why the policy refuses `address` when no allow-list names it (None: a public address)."""
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped or address.sixtofour
        if mapped is not None:
            reason = refused_reason(mapped)
            return None if reason is None else f"{reason} (as IPv4 {mapped} inside IPv6)"
    checks = (
        (address in METADATA, "a cloud metadata address"),
        (address.is_unspecified, "the unspecified address"),
        (address.is_loopback, "a loopback address"),
        (address.is_link_local, "a link-local address"),
        (address.is_private, "a private address"),
        (address.is_multicast, "a multicast address"),
        (address.is_reserved, "a reserved address"),
        (isinstance(address, ipaddress.IPv6Address) and address.is_site_local, "a site-local address"),
        (not address.is_global, "not a public address"),
    )
    return next((why for hit, why in checks if hit), None)


@dataclass
class AddressPolicy:
    """Which addresses an import may connect to: public ones, plus what `allow` names (operator setting).
    `resolver` is the seam tests map names through (one policy object is shared by the route and the runner)."""

    allow: Sequence[Network] = ()
    resolver: Resolver = field(default=system_resolver)

    def check(self, address: IPAddress, host: str) -> None:
        shown = host if host == str(address) else f"{host} resolves to {address}, which"
        if address in METADATA and not any(address in n and n.prefixlen == n.max_prefixlen for n in self.allow):
            raise AddressRefused(f"{shown} is a cloud metadata address; imports never connect to it")
        reason = refused_reason(address)
        if reason is not None and not any(address in n for n in self.allow):
            raise AddressRefused(f"{shown} is {reason}; imports connect only to public addresses")

    def resolve(self, host: str, port: int) -> IPAddress:
        """The one address to connect to for `host`: every address it resolves to must pass (a name that
        resolves to one refused address is refused, whatever else it resolves to)."""
        literal = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        try:
            addresses = [ipaddress.ip_address(literal)]
        except ValueError:
            addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in self.resolver(literal, port)]
        if not addresses:
            raise AddressRefused(f"host {host!r} does not resolve")
        for address in addresses:
            self.check(address, literal)
        return addresses[0]
