"""One HTTP POST to a receiver, safely: the address is checked after DNS
resolution and the connection goes to that checked address (no second lookup a
rebinding DNS server could answer differently), redirects are not followed, a
short timeout bounds each step and the response is read up to a cap."""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from jobstate import conf

USER_AGENT = "jobstate-webhooks/1"


class Blocked(Exception):
    """The URL may not be delivered to (a private address, a bad scheme)."""


@dataclass
class Response:
    status: int
    body: bytes
    seconds: float


def forbidden(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or not ip.is_global
    )


def resolve(host: str, port: int) -> str:
    """The address to connect to: the first one DNS gives, refused if any of them
    is not public (unless WEBHOOK_ALLOW_PRIVATE)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConnectionError(f"cannot resolve {host}: {exc}") from exc
    addresses = [str(info[4][0]) for info in infos]  # a str already for IPv4 and IPv6
    if not conf.get("WEBHOOK_ALLOW_PRIVATE"):
        bad = [a for a in addresses if forbidden(a)]
        if bad:
            raise Blocked(f"{host} resolves to a non-public address ({bad[0]}); see WEBHOOK_ALLOW_PRIVATE")
    return addresses[0]


def check_url(url: str) -> tuple[str, str, int, str]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Blocked(f"only http and https URLs are delivered to, not {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return parts.scheme, parts.hostname, port, target


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to a given address, verifying the certificate for the URL's host name."""

    def __init__(self, address: str, host: str, port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def post(url: str, body: bytes, headers: dict[str, str]) -> Response:
    """POST ``body``; return the status and the first WEBHOOK_MAX_RESPONSE_BYTES of the
    response. Raises ``Blocked`` or an ``OSError``/``http.client`` error."""
    scheme, host, port, target = check_url(url)
    timeout = float(conf.get("WEBHOOK_TIMEOUT"))
    cap = int(conf.get("WEBHOOK_MAX_RESPONSE_BYTES"))
    started = time.monotonic()
    address = resolve(host, port)
    conn: http.client.HTTPConnection
    if scheme == "https":
        conn = _PinnedHTTPSConnection(address, host, port, timeout)
    else:
        conn = http.client.HTTPConnection(address, port, timeout=timeout)
    try:
        conn.putrequest("POST", target, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host if port in (80, 443) else f"{host}:{port}")
        all_headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "Content-Length": str(len(body)),
            **headers,
        }
        for name, value in all_headers.items():
            conn.putheader(name, value)
        conn.endheaders(body)
        response = conn.getresponse()
        data = response.read(cap)
        return Response(response.status, data, time.monotonic() - started)
    finally:
        conn.close()
