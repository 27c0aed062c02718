"""The text a failed delivery attempt stores about its error.

The endpoint's owner reads it (``GET /api/webhooks/{id}/deliveries/``, the admin,
the endpoint's ``disabled_reason``), so it says what went wrong in the owner's
terms and leaves out what only the server should know: the addresses this
server's DNS gave, the TLS library's source lines, whatever an unexpected
exception carries. The exception itself stays in the delivery job's traceback
and, for the unexpected ones, in the ``jobstate.webhooks`` log.
"""

from __future__ import annotations

import http.client
import logging
import re
import ssl

from jobstate.webhooks import transport

logger = logging.getLogger("jobstate.webhooks")

# OpenSSL's errors end with the line of CPython's _ssl.c that raised them.
_SOURCE_LINE = re.compile(r"\s*\(_ssl\.c:\d+\)\s*$")


def public(exc: BaseException) -> str:
    """What to store (and show the endpoint's owner) about ``exc``."""
    if isinstance(exc, transport.Blocked):
        return str(exc)  # composed by transport, without the resolved address
    name = type(exc).__name__
    if isinstance(exc, (transport.Unresolvable, transport.DeadlineExceeded)):
        return f"{name}: {exc}"  # composed by transport too
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate not accepted: {exc.verify_message or _ssl_text(exc)}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS error: {_ssl_text(exc)}"
    if isinstance(exc, http.client.HTTPException):
        # About the receiver's answer (closed without one, a malformed status line or
        # header): what the endpoint's own server sent, before any OSError's rule.
        return f"{name}: {exc}"[:500]
    if isinstance(exc, OSError):
        # The C library's message only: an OSError's text can name an address or a
        # file (``[Errno 113] No route to host: '10.0.0.7'``).
        reason = exc.strerror or ("timed out" if isinstance(exc, TimeoutError) else "")
        return f"{name}: {reason}" if reason else name
    logger.warning("webhook delivery failed with an unexpected error", exc_info=exc)
    return f"{name} (details in the server's log)"


def _ssl_text(exc: ssl.SSLError) -> str:
    return _SOURCE_LINE.sub("", str(exc.strerror or exc.reason or "handshake failed"))
