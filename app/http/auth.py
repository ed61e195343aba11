"""Who may write: the keys file, game servers' API keys and HMAC secrets, the admin key.

`POST /v1/events` needs a game server's credential: an API key (`Authorization: Bearer
<key>` or `X-API-Key`), or a signature (`X-Server-Id` + `X-Timestamp: <Unix seconds>` +
`X-Signature: sha256=<hex>`): the HMAC-SHA256 under the server's secret of the request
itself, `METHOD\nPATH?QUERY\nTIMESTAMP\nBODY` (`canonical_request`), so a captured request
is good for its own method, path and body only; it is refused more than 5 minutes either
side of the server's clock. Admin routes need the separate admin key. Every comparison of
a secret runs in constant time.

A server may carry a rate limit (`events_per_second` and `burst`), enforced across workers
by `app.http.ratelimit`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import tomllib
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from app.http.errors import ApiError
from leaderboard.settings import SettingsError
from leaderboard.timeutil import format_instant
from leaderboard.validation import ID_PATTERN, ID_RULE

__all__ = ["ADMIN_BEARER", "ADMIN_KEY", "SERVER_BEARER", "SERVER_KEY", "SERVER_SIGNATURE",
           "SIGNATURE_WINDOW", "ApiKeys", "ServerCredential", "canonical_request",
           "check_admin", "check_server", "check_signed", "signature_digest", "signature_hex",
           "token_of"]

#: How far X-Timestamp of a signed request may be from the server's clock, either way.
SIGNATURE_WINDOW = timedelta(minutes=5)
_MIN_KEY_LENGTH = 16
#: The canonical request, as error messages name it.
_SIGNED = "'METHOD\\nPATH?QUERY\\nTIMESTAMP\\nBODY'"
_ID = re.compile(ID_PATTERN)


@dataclass(frozen=True)
class ServerCredential:
    """One game server: its API key and/or its HMAC secret."""

    server_id: str
    key: str | None = None
    secret: str | None = None
    #: Events per second this server may post (None: unlimited), and how many it may post at
    #: once after a quiet spell (the token bucket's size; default: one second's worth).
    events_per_second: float | None = None
    burst: int | None = None


@dataclass(frozen=True)
class ApiKeys:
    """Who may write: per-server credentials, and the separate admin key."""

    servers: tuple[ServerCredential, ...] = ()
    admin_key: str | None = None
    source: str = "<none>"

    @classmethod
    def load(cls, path: Path, *, admin_key: str | None = None) -> ApiKeys:
        """A TOML or JSON (by extension) keys file; `admin_key` (the env var) wins over the
        file's."""
        what = f"LEADERBOARD_API_KEYS={path}"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise SettingsError(f"{what}: cannot read the keys file ({exc.strerror}); "
                                "point it at a TOML or JSON file of server keys") from None
        try:
            raw = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            raise SettingsError(f"{what}: not valid {path.suffix or 'TOML'} ({exc})") from None
        return cls.parse(raw, source=str(path), admin_key=admin_key)

    @classmethod
    def parse(cls, raw: Any, *, source: str = "<dict>", admin_key: str | None = None) -> ApiKeys:
        """{"admin_key": ..., "servers": {id: key | {"key": ..., "secret": ...,
        "events_per_second": ..., "burst": ...}}}."""
        def fail(where: str, why: str) -> SettingsError:
            return SettingsError(f"keys file {source}: `{where}` {why}")

        if not isinstance(raw, dict):
            raise fail("(top)", "must be a table/object")
        unknown = set(raw) - {"admin_key", "servers"}
        if unknown:
            raise fail(sorted(unknown)[0], "is not a known key (known: admin_key, servers)")
        servers_raw = raw.get("servers", {})
        if not isinstance(servers_raw, dict):
            raise fail("servers", "must map server_id to a key or to {key, secret}")
        servers = []
        for server_id, entry in sorted(servers_raw.items()):
            where = f"servers.{server_id}"
            if not _ID.match(server_id):
                raise fail(where, f"names a server_id that is not {ID_RULE}")
            if isinstance(entry, str):
                entry = {"key": entry}
            if (not isinstance(entry, dict) or not {"key", "secret"} & set(entry)
                    or set(entry) - {"key", "secret", "events_per_second", "burst"}):
                raise fail(where, "must be a key string or a table with `key` and/or `secret` "
                                  "(and optionally `events_per_second`, `burst`)")
            for name in ("key", "secret"):
                value = entry.get(name)
                if value is not None and (not isinstance(value, str)
                                          or len(value) < _MIN_KEY_LENGTH):
                    raise fail(f"{where}.{name}",
                               f"must be a string of at least {_MIN_KEY_LENGTH} characters")
            rate, burst = _rate_of(entry, where, fail)
            servers.append(ServerCredential(server_id, entry.get("key"), entry.get("secret"),
                                            rate, burst))
        admin = admin_key if admin_key is not None else raw.get("admin_key")
        if admin is not None and (not isinstance(admin, str) or len(admin) < _MIN_KEY_LENGTH):
            raise fail("admin_key", f"must be a string of at least {_MIN_KEY_LENGTH} characters")
        keys = [s.key for s in servers if s.key] + [s.secret for s in servers if s.secret]
        if len(set(keys)) != len(keys):
            raise fail("servers", "gives two servers the same key or secret")
        if admin is not None and admin in keys:
            raise fail("admin_key", "equals a server's key; the admin key must be separate")
        return cls(tuple(servers), admin, source)

    def limit_of(self, server_id: str) -> tuple[float, int] | None:
        """(events per second, burst) of a server, None when it has no limit."""
        for server in self.servers:
            if server.server_id == server_id and server.events_per_second is not None:
                assert server.burst is not None
                return server.events_per_second, server.burst
        return None

    def server_for_key(self, key: str) -> str | None:
        """The server holding this API key. Every key is compared (in constant time each),
        so the time taken says nothing about which key came close."""
        found = None
        given = key.encode()
        for server in self.servers:
            if server.key is not None and hmac.compare_digest(server.key.encode(), given):
                found = server.server_id
        return found

    def verify_signature(self, server_id: str, message: bytes, signature: str) -> bool:
        """Whether `signature` (hex, optionally prefixed `sha256=` in any case) is the
        HMAC-SHA256 of `message` (the canonical request) under the server's secret."""
        secret = next((s.secret for s in self.servers if s.server_id == server_id), None)
        expected = signature_digest(secret or "", message)
        return (hmac.compare_digest(expected.encode(),
                                    signature_hex(signature).encode("utf-8", "replace"))
                and secret is not None)

    def is_admin(self, key: str) -> bool:
        return self.admin_key is not None and hmac.compare_digest(self.admin_key.encode(),
                                                                  key.encode())


def canonical_request(method: str, path: bytes, query: bytes, timestamp: str,
                      body: bytes) -> bytes:
    """What a signature covers: `METHOD\nPATH?QUERY\nTIMESTAMP\nBODY`. PATH and QUERY are
    the bytes of the request line (percent-encoding as sent, nothing decoded or
    reordered); the `?` is there even when the query is empty, so every canonical request
    has the same four parts. With the method and path signed, a captured request cannot be
    sent to another player's path or route."""
    return b"\n".join((method.encode("ascii", "replace"), path + b"?" + query,
                       timestamp.encode("ascii", "replace"), body))


def signature_digest(secret: str, message: bytes) -> str:
    """The lower-case hex HMAC-SHA256 of `message` under `secret` (UTF-8)."""
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def signature_hex(signature: str) -> str:
    """X-Signature's hex digest: without the optional `sha256=` prefix (any case), lower
    case."""
    given = signature.strip()
    if given[:7].lower() == "sha256=":
        given = given[7:]
    return given.lower()


def _rate_of(entry: dict[str, Any], where: str,
             fail: Any) -> tuple[float | None, int | None]:
    """A server's (events_per_second, burst): both absent, or a positive rate and a whole
    burst >= 1 (default: the rate rounded up, at least 1)."""
    rate, burst = entry.get("events_per_second"), entry.get("burst")
    if rate is None:
        if burst is not None:
            raise fail(f"{where}.burst", "needs `events_per_second` beside it")
        return None, None
    if (isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate)
            or rate <= 0):
        raise fail(f"{where}.events_per_second",
                   f"is {rate!r}; use a number of events per second above 0 (e.g. 50 or 0.5)")
    if burst is None:
        burst = max(1, math.ceil(rate))
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
        raise fail(f"{where}.burst", f"is {burst!r}; use a whole number of events >= 1")
    return float(rate), burst


#: The credentials as OpenAPI security schemes (Swagger's Authorize button; Schemathesis
#: checks each is enforced). Each is optional on its own: a route requires one of them.
SERVER_BEARER = HTTPBearer(scheme_name="serverBearer", auto_error=False,
                           description="a game server's API key as `Authorization: Bearer`")
SERVER_KEY = APIKeyHeader(name="X-API-Key", scheme_name="serverKey", auto_error=False,
                          description="a game server's API key")
SERVER_SIGNATURE = APIKeyHeader(
    name="X-Signature", scheme_name="serverSignature", auto_error=False,
    description="`sha256=<hex HMAC-SHA256>` under the server's secret of "
                "`METHOD\\nPATH?QUERY\\nTIMESTAMP\\nBODY` (the request line's method, path "
                "and query as sent, `?` kept when the query is empty, X-Timestamp, the body "
                "bytes), with X-Server-Id and X-Timestamp (Unix seconds, within 5 minutes)")
ADMIN_BEARER = HTTPBearer(scheme_name="adminBearer", auto_error=False,
                          description="the admin key as `Authorization: Bearer`")
ADMIN_KEY = APIKeyHeader(name="X-Admin-Key", scheme_name="adminKey", auto_error=False,
                         description="the admin key")


def token_of(bearer: HTTPAuthorizationCredentials | None, key: str | None) -> str | None:
    """The credential sent: a bearer token wins over the key header, as documented."""
    if bearer is not None and bearer.credentials.strip():
        return bearer.credentials.strip()
    return key


def check_server(keys: ApiKeys, token: str | None, signed: bool) -> str | None:
    """The server an API key names (None: the request is signed instead, and the signature
    is checked once the body is read). 401 without any credential, 403 for a wrong key."""
    if token is None and not signed:
        raise ApiError(401, "unauthenticated",
                       "send the server's API key (Authorization: Bearer <key> or "
                       "X-API-Key), or X-Server-Id, X-Timestamp and X-Signature (HMAC-SHA256 "
                       f"of {_SIGNED}",
                       headers={"WWW-Authenticate": "Bearer"})
    if token is None:
        return None
    server_id = keys.server_for_key(token)
    if server_id is None:
        raise ApiError(403, "forbidden", "the API key is not one of the configured "
                                         f"server keys ({keys.source})")
    return server_id


def check_signed(keys: ApiKeys, server_id: str, timestamp: str | None, signature: str,
                 request: tuple[str, bytes, bytes, bytes], now: datetime) -> str:
    """The server of a signed request: its signature must cover the canonical request
    (`request` is its method, raw path, raw query and body) and the timestamp be within
    SIGNATURE_WINDOW of the server's clock, so a captured request cannot be replayed later,
    nor sent elsewhere (within the window, the idempotency door drops a replayed event, and
    a profile write answers a replay as the first, `app.http.replay`)."""
    if timestamp is None:
        raise ApiError(401, "unauthenticated",
                       "a signed request needs X-Timestamp (Unix seconds) and X-Signature: "
                       f"sha256=<hex HMAC-SHA256 of {_SIGNED}>",
                       headers={"WWW-Authenticate": "Bearer"})
    text = timestamp.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 12:
        raise ApiError(403, "forbidden", f"X-Timestamp {text[:40]!r} is not Unix seconds "
                                         "(an integer such as 1764612000)")
    skew = abs(now.timestamp() - int(text))
    if skew > SIGNATURE_WINDOW.total_seconds():
        raise ApiError(403, "forbidden",
                       f"X-Timestamp {text} is {skew:,.0f} s from the server's clock "
                       f"({format_instant(now)}); signatures are accepted for "
                       f"{SIGNATURE_WINDOW.total_seconds():.0f} s: sign again with the "
                       "current time (and check the clock)")
    method, path, query, body = request
    if not keys.verify_signature(server_id, canonical_request(method, path, query, text, body),
                                 signature):
        raise ApiError(403, "forbidden", f"X-Signature is not the HMAC-SHA256 of {_SIGNED} "
                                         "under that server's secret (this request's method, "
                                         "path and query exactly as sent, `?` kept when the "
                                         "query is empty; see the README)")
    return server_id


def check_admin(keys: ApiKeys, token: str | None) -> None:
    """401 without a key, 403 unless it is the admin key."""
    if token is None:
        raise ApiError(401, "unauthenticated", "send the admin key (Authorization: Bearer "
                                               "<key> or X-Admin-Key)",
                       headers={"WWW-Authenticate": "Bearer"})
    if not keys.is_admin(token):
        configured = keys.admin_key is not None
        raise ApiError(403, "forbidden", "wrong admin key" if configured else
                       "no admin key is configured: set LEADERBOARD_ADMIN_KEY")
