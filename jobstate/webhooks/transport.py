"""One HTTP POST to a receiver, safely: the addresses are checked after DNS
resolution and the connection goes to those checked addresses, in DNS order, the
next one when one cannot be connected to (no second lookup a rebinding DNS server
could answer differently), redirects are not followed,
WEBHOOK_TIMEOUT bounds the whole request and the response is read up to a cap.

The deadline is for the request as a whole, not per connect or per read: a
receiver that drips its answer a byte at a time would satisfy every socket
timeout while holding the delivery for as long as it likes. Socket timeouts
are set to the time left, and a timer shuts the socket down when the deadline
passes, whichever step (sending, the status line and headers, the body) is
under way; the request then fails with ``DeadlineExceeded``."""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import logging
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from jobstate import conf

USER_AGENT = "jobstate-webhooks/1"

logger = logging.getLogger("jobstate.webhooks")


class Blocked(Exception):
    """The URL may not be delivered to (a private address, a bad scheme or port)."""


class Unresolvable(ConnectionError):
    """DNS gives no address for the host (retried)."""


class DeadlineExceeded(TimeoutError):
    """The receiver did not take and answer the request within WEBHOOK_TIMEOUT (retried)."""


@dataclass
class Response:
    status: int
    body: bytes
    seconds: float


# IPv6 prefixes that carry an IPv4 address in their low 32 bits (NAT64's
# well-known prefix) or reach a local IPv4 network (NAT64's local-use prefix).
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")


def forbidden(address: str) -> bool:
    """Whether ``address`` is not a public one: private, loopback, link-local,
    site-local, multicast, reserved, unspecified or otherwise not global; an IPv6 address
    that embeds an IPv4 one (mapped, 6to4, NAT64) is judged by that address,
    which a relay or gateway on the way would reach."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        # Site-local (fec0::/10) is neither private nor reserved to ipaddress.
        if ip in _NAT64_LOCAL or ip.is_site_local:
            return True
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            ip = embedded
    return (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or not ip.is_global
    )


def resolve(host: str, port: int) -> list[str]:
    """The addresses to connect to, in the order DNS gives them (repeats removed),
    refused if any of them is not public (unless WEBHOOK_ALLOW_PRIVATE).

    The refusal does not name the address: its text is stored for the endpoint's
    owner, who could otherwise read this server's DNS answers for internal names.
    Operators find the address in the log."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise Unresolvable(f"cannot resolve {host}: {exc.strerror or 'no address'}") from exc
    # A str already for IPv4 and IPv6; one per socket type and protocol, repeats dropped.
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not conf.get("WEBHOOK_ALLOW_PRIVATE"):
        bad = [a for a in addresses if forbidden(a)]
        if bad:
            logger.warning(
                "webhook delivery to %s refused: it resolves to %s, a non-public address", host, bad[0]
            )
            raise Blocked(f"{host} resolves to a non-public address; see WEBHOOK_ALLOW_PRIVATE")
    return addresses


def connect(addresses: list[str], port: int, deadline: float) -> socket.socket:
    """A connection to the first of ``addresses`` that takes one, tried in turn as
    ``socket.create_connection`` tries a name's (a receiver with an IPv6 address this
    server cannot reach, or one node down, is reached at the next), each with the
    time left before ``deadline``. Raises the last attempt's error."""
    error: OSError | None = None
    for address in addresses:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            sock = socket.create_connection((address, port), left)
        except OSError as exc:
            error = exc
            continue
        with contextlib.suppress(OSError):  # as http.client's own connect
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    if error is None:
        raise DeadlineExceeded("no time was left to connect")
    raise error


def check_url(url: str) -> tuple[str, str, int, str]:
    """The scheme, host, port and request target of ``url``; ``Blocked`` if it is
    not an http(s) URL with a host and a port from 1 to 65535, in ASCII."""
    if not url.isascii():
        # http.client sends the request line and Host header in ASCII only: such a
        # URL failed every attempt with UnicodeEncodeError, sending nothing.
        raise Blocked(
            f"{url!r} is not an ASCII URL: percent-encode the path and query, and give an "
            "internationalized host name in its punycode form (xn--...)"
        )
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError when out of range or not a number
    except ValueError:
        raise Blocked(f"{url!r} is not a valid URL (a port is 1 to 65535)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Blocked(f"only http and https URLs are delivered to, not {url!r}")
    if port == 0:
        raise Blocked(f"{url!r} is not a valid URL (a port is 1 to 65535)")
    port = port or (443 if parts.scheme == "https" else 80)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return parts.scheme, parts.hostname, port, target


class _Deadline:
    """Shuts the watched socket down at ``deadline`` (time.monotonic) unless
    ``finish`` came first: a blocked send or read then ends at once. (Connecting
    is bounded by the socket timeout, set to the time left.)"""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.expired = False
        self._sock: socket.socket | None = None
        self._finished = False
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(deadline - time.monotonic(), 0.0), self._cut)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket) -> None:
        """Shut ``sock`` down at the deadline (at once if it has passed)."""
        with self._lock:
            self._sock = sock
            if self.expired:
                self._shutdown()

    def _cut(self) -> None:
        with self._lock:
            if not self._finished:
                self.expired = True
                self._shutdown()

    def _shutdown(self) -> None:
        if self._sock is not None:
            # The plain socket's shutdown: an SSLSocket's would drop its SSL object.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(self._sock, socket.SHUT_RDWR)

    def finish(self) -> bool:
        """Stop the timer; whether the deadline passed (then the answer, perhaps cut
        short, is not to be trusted)."""
        with self._lock:
            self._finished = True
            self._timer.cancel()
            return self.expired or time.monotonic() >= self.deadline


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """HTTP to the checked addresses (``connect``)."""

    def __init__(self, addresses: list[str], host: str, port: int, timeout: float, guard: _Deadline) -> None:
        super().__init__(host, port, timeout=timeout)
        self._addresses = addresses
        self._guard = guard

    def connect(self) -> None:
        self.sock = connect(self._addresses, self.port, self._guard.deadline)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to the checked addresses (``connect``), verifying the certificate for the
    URL's host name; ``guard`` watches the socket from before the TLS handshake on."""

    def __init__(self, addresses: list[str], host: str, port: int, timeout: float, guard: _Deadline) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._addresses = addresses
        self._guard = guard

    def connect(self) -> None:
        sock = connect(self._addresses, self.port, self._guard.deadline)
        context: ssl.SSLContext = self._context  # type: ignore[attr-defined]
        tls = context.wrap_socket(sock, server_hostname=self.host, do_handshake_on_connect=False)
        self.sock = tls
        self._guard.watch(tls)
        tls.do_handshake()


def post(url: str, body: bytes, headers: dict[str, str]) -> Response:
    """POST ``body``; return the status and the first WEBHOOK_MAX_RESPONSE_BYTES of the
    response. Raises ``Blocked``, ``DeadlineExceeded`` (WEBHOOK_TIMEOUT passed, counted
    from the start of the request) or an ``OSError``/``http.client`` error."""
    scheme, host, port, target = check_url(url)
    timeout = float(conf.get("WEBHOOK_TIMEOUT"))
    cap = int(conf.get("WEBHOOK_MAX_RESPONSE_BYTES"))
    started = time.monotonic()
    deadline = started + timeout
    late = f"the receiver did not answer within {timeout} s in all (WEBHOOK_TIMEOUT)"
    addresses = resolve(host, port)
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded(late)
    guard = _Deadline(deadline)
    pinned = _PinnedHTTPSConnection if scheme == "https" else _PinnedHTTPConnection
    conn = pinned(addresses, host, port, left, guard)
    try:
        try:
            response = _exchange(conn, guard, host_header(scheme, host, port), target, body, headers, cap)
        except Exception as exc:
            if guard.finish():
                raise DeadlineExceeded(late) from exc
            raise
        if guard.finish():  # a cut can look like a short answer that ended early
            raise DeadlineExceeded(late)
        status, data = response
        return Response(status, data, time.monotonic() - started)
    finally:
        guard.finish()
        conn.close()


def host_header(scheme: str, host: str, port: int) -> str:
    """The Host header of a request to ``host``: an IPv6 address in brackets, the port
    unless it is the scheme's default (as http.client writes it)."""
    name = f"[{host}]" if ":" in host else host
    return name if port == (443 if scheme == "https" else 80) else f"{name}:{port}"


def _exchange(
    conn: http.client.HTTPConnection,
    guard: _Deadline,
    host_header: str,
    target: str,
    body: bytes,
    headers: dict[str, str],
    cap: int,
) -> tuple[int, bytes]:
    conn.connect()
    guard.watch(conn.sock)  # kept: a ``Connection: close`` answer takes it from ``conn``
    conn.putrequest("POST", target, skip_host=True, skip_accept_encoding=True)
    conn.putheader("Host", host_header)
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
    try:
        return response.status, response.read(cap)
    finally:
        response.close()
