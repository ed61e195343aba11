"""Who may write: the keys file, game servers' API keys and HMAC secrets, the admin key.

`POST /v1/events` needs a game server's credential: an API key (`Authorization: Bearer
<key>` or `X-API-Key`), or an HMAC-SHA256 under the server's secret of
`<X-Timestamp>.<body>` (`X-Server-Id` + `X-Timestamp: <Unix seconds>` + `X-Signature:
sha256=<hex>`), refused more than 5 minutes either side of the server's clock. Admin routes
need the separate admin key. Every comparison of a secret runs in constant time.

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
           "SIGNATURE_WINDOW", "ApiKeys", "ServerCredential", "check_admin", "check_server",
           "check_signed", "token_of"]

#: How far X-Timestamp of a signed request may be from the server's clock, either way.
SIGNATURE_WINDOW = timedelta(minutes=5)
_MIN_KEY_LENGTH = 16
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

    def verify_signature(self, server_id: str, timestamp: str, body: bytes,
                         signature: str) -> bool:
        """Whether `signature` (hex, optionally prefixed `sha256=` in any case) is the
        HMAC-SHA256 of `<timestamp>.<body>` under the server's secret."""
        secret = next((s.secret for s in self.servers if s.server_id == server_id), None)
        expected = hmac.new((secret or "").encode(), timestamp.encode() + b"." + body,
                            hashlib.sha256).hexdigest()
        given = signature.strip()
        if given[:7].lower() == "sha256=":
            given = given[7:]
        return (hmac.compare_digest(expected.encode(), given.lower().encode("utf-8", "replace"))
                and secret is not None)

    def is_admin(self, key: str) -> bool:
        return self.admin_key is not None and hmac.compare_digest(self.admin_key.encode(),
                                                                  key.encode())


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
    description="`sha256=<hex HMAC-SHA256 of '<X-Timestamp>.<body>'>` under the server's "
                "secret, with X-Server-Id and X-Timestamp (Unix seconds, within 5 minutes)")
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
                       "of '<timestamp>.<body>')",
                       headers={"WWW-Authenticate": "Bearer"})
    if token is None:
        return None
    server_id = keys.server_for_key(token)
    if server_id is None:
        raise ApiError(403, "forbidden", "the API key is not one of the configured "
                                         f"server keys ({keys.source})")
    return server_id


def check_signed(keys: ApiKeys, server_id: str, timestamp: str | None, signature: str,
                 body: bytes, now: datetime) -> str:
    """The server of a signed request: its signature must cover `<X-Timestamp>.<body>` and
    the timestamp be within SIGNATURE_WINDOW of the server's clock, so a captured request
    cannot be replayed later (within the window, the idempotency door drops a replay)."""
    if timestamp is None:
        raise ApiError(401, "unauthenticated",
                       "a signed request needs X-Timestamp (Unix seconds) and X-Signature: "
                       "sha256=<hex HMAC-SHA256 of '<timestamp>.<body>'>",
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
    if not keys.verify_signature(server_id, text, body, signature):
        raise ApiError(403, "forbidden", "X-Signature is not the HMAC-SHA256 of "
                                         "'<X-Timestamp>.<body>' under that server's secret")
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
