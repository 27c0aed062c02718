"""Whether an open progress stream's (or a long-poll's) client may still see its job.

The view checks access once, when the stream opens; a stream lasts up to
``SSE_MAX_SECONDS``, a long-poll waits up to ``LONGPOLL_MAX_SECONDS``.
``StreamAccess.refusal`` checks again (the stream calls it every
``ACCESS_CHECK_SECONDS``; the long-poll calls ``lost`` once it has waited): the
request's credentials are authenticated again as DRF did when the stream opened,
against the database as it is now, and the job is looked up again with
``visible_jobs``. When either fails it answers the error a new request would get
(401 or 404: nothing about the job).

- Token (and any other scheme the project adds, e.g. JWT): the authenticator runs
  again on the request's headers (``TokenAuthentication``: one query, the token
  and its user, inactive users refused).
- Session: the session is read again from its store (the request's copy is cached)
  and must still name the same user, whose password (session auth hash) has not
  changed, loaded through the session's backend (inactive users refused).
- Basic: the password is not hashed again every few seconds (deliberately slow);
  the user must still exist, be active and have the same password hash.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, SESSION_KEY, get_user_model, load_backend
from django.utils.crypto import constant_time_compare
from django.utils.translation import gettext as _
from rest_framework.authentication import BasicAuthentication, SessionAuthentication
from rest_framework.exceptions import APIException, AuthenticationFailed, NotAuthenticated, NotFound
from rest_framework.request import Request

from jobstate.api.errors import api_error_body
from jobstate.api.permissions import visible_jobs


def _auth_hash(user: Any) -> str:
    get_hash = getattr(user, "get_session_auth_hash", None)
    return str(get_hash()) if get_hash is not None else ""


class StreamAccess:
    """The credentials a stream was opened with, to check them again later."""

    def __init__(self, request: Request, job_id: Any) -> None:
        self.request = request
        self.job_id = job_id
        self.authenticator = request.successful_authenticator
        self.user_pk: Any = request.user.pk
        self.auth_hash = _auth_hash(request.user)
        session = getattr(request._request, "session", None)
        self.session_key = getattr(session, "session_key", None)

    def refusal(self) -> dict[str, Any] | None:
        """None while the client may still see the job; else the error body to send."""
        lost = self.lost()
        return None if lost is None else api_error_body(lost)

    def lost(self) -> APIException | None:
        """None while the client may still see the job; else the error a new request gets."""
        try:
            user = self._user()
            if user is None:
                raise NotAuthenticated()
            if not visible_jobs(user).filter(pk=self.job_id).exists():
                raise NotFound()
        except APIException as exc:
            return exc
        return None

    def _user(self) -> Any | None:
        """The request's user as its credentials name them now (None: they name nobody,
        or another user)."""
        if isinstance(self.authenticator, SessionAuthentication):
            user = self._session_user()
        elif isinstance(self.authenticator, BasicAuthentication):
            user = get_user_model()._default_manager.filter(pk=self.user_pk).first()
            if (
                user is None
                or not user.is_active
                or not constant_time_compare(_auth_hash(user), self.auth_hash)
            ):
                raise AuthenticationFailed(_("Invalid username/password."))  # DRF's words
        elif self.authenticator is not None:
            found = self.authenticator.authenticate(self.request)
            user = found[0] if found else None
        else:
            return None
        if user is None or user.pk != self.user_pk or not getattr(user, "is_active", False):
            return None
        return user

    def _session_user(self) -> Any | None:
        if not self.session_key:
            return None
        # A store of its own: the request's holds the session as it was read at the start.
        session = import_module(settings.SESSION_ENGINE).SessionStore(self.session_key)
        try:
            user_pk = get_user_model()._meta.pk.to_python(session[SESSION_KEY])
            backend = session[BACKEND_SESSION_KEY]
        except KeyError:
            return None  # logged out (or the session expired)
        if user_pk != self.user_pk or backend not in settings.AUTHENTICATION_BACKENDS:
            return None
        user = load_backend(backend).get_user(user_pk)
        if user is None or not constant_time_compare(_auth_hash(user), self.auth_hash):
            return None  # a changed password ends the user's sessions (Django's rule)
        return user
