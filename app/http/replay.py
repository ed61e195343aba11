"""Request ids: a write that is not idempotent by its content is applied once per id.

A profile write is "latest wins", unlike events and scores (the idempotency door drops a
retry by its ids): a captured signed write sent again after a later rename would put the
old name back. So a profile write has a request id, remembered in Redis for
`REMEMBERED` (twice SIGNATURE_WINDOW: a signature is good from its timestamp minus the
window to its timestamp plus the window): for a signed request its signature (any other
request has another, and only the secret's holder can make one), for an API-key request
its optional `X-Request-Id` (a retry-safety aid: the key's holder may send anything). The
first request with an id is applied; a repeat applies nothing. While the first is being
applied a repeat is answered 409; when the first failed, its id is forgotten, so the same
request may be sent again. A repeat is the same request: the id is stored with a digest of
its method, path and body, and the id sent with another request within REMEMBERED is a
422 `request_id_reused` (answering it as a repeat would tell the sender a write it never
saved succeeded).

Only a hash of the id is stored (the key names the server, never the player), so an
erasure leaves nothing of the player here.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from app.http.auth import SIGNATURE_WINDOW
from app.http.errors import ApiError

__all__ = ["REMEMBERED", "REQUEST_ID_RULE", "applied_once", "checked_request_id",
           "request_digest", "request_key"]

#: How long a request id is remembered.
REMEMBERED = 2 * SIGNATURE_WINDOW
#: Seconds a claim stands while its request is applied: a worker that died meanwhile
#: blocks the id no longer than this.
_PENDING_SECONDS = 30
_PENDING, _DONE = b"pending", b"done"
REQUEST_ID_RULE = "1-128 visible ASCII characters (e.g. a UUID)"
_REQUEST_ID = re.compile(r"[!-~]{1,128}")


def request_key(server_id: str, request_id: str) -> str:
    """One key per (server, id), in the server's Redis Cluster slot."""
    digest = hashlib.sha256(request_id.encode("utf-8", "replace")).hexdigest()
    return f"lb:request:{{{server_id}}}:{digest}"


def request_digest(method: str, path: str, body: bytes) -> bytes:
    """What makes a request the same request: its method, path and body, hashed."""
    digest = hashlib.sha256()
    for part in (method.encode(), b"\n", path.encode("utf-8", "replace"), b"\n", body):
        digest.update(part)
    return digest.hexdigest().encode()


def _same_request(state: bytes, digest: bytes) -> bool:
    """Whether a stored state (`pending:<digest>` or `done:<digest>`) is of this request; a
    state without a digest (stored before digests were) cannot tell, and counts as it."""
    _, _, stored = state.partition(b":")
    return not stored or stored == digest


def checked_request_id(value: str | None) -> str | None:
    """X-Request-Id as sent, or a 422 that says what an id may hold."""
    if value is None:
        return None
    if not _REQUEST_ID.fullmatch(value):
        raise ApiError(422, "bad_request_id", f"X-Request-Id must be {REQUEST_ID_RULE}; send "
                                              "a new one for each write, the same one for a "
                                              "retry of it")
    return value


@contextmanager
def applied_once(client: redis.Redis, server_id: str, request_id: str | None,
                 digest: bytes) -> Iterator[bool]:
    """Yields whether to apply the request (`digest`: its `request_digest`): False for a
    repeat of one already applied within REMEMBERED (apply nothing), True otherwise (no id:
    always). A repeat of one being applied right now is a 409 with Retry-After; the id of
    another request is a 422 `request_id_reused`; an exception in the body forgets the id
    again (nothing was applied, or the request says to send it again)."""
    if request_id is None:
        yield True
        return
    key = request_key(server_id, request_id)
    while not client.set(key, _PENDING + b":" + digest, nx=True, ex=_PENDING_SECONDS):
        state = client.get(key)
        if isinstance(state, str):  # a client decoding answers
            state = state.encode()
        if state is None:
            continue  # forgotten meanwhile: claim it again
        if not _same_request(state, digest):
            raise ApiError(422, "request_id_reused",
                           "this request id was used within the last 10 minutes for another "
                           "request (another method, path or body); nothing was saved: send "
                           "each write with a new id, and the same id only with a retry of "
                           "the same request")
        if state.startswith(_DONE):
            yield False
            return
        raise ApiError(409, "in_flight_elsewhere",
                       "this request (its request id) is being applied right now by an "
                       "earlier send of it; send it again after Retry-After to see the "
                       "result", headers={"Retry-After": "1"})
    try:
        yield True
    except BaseException:
        client.delete(key)
        raise
    client.set(key, _DONE + b":" + digest, ex=int(REMEMBERED.total_seconds()))
