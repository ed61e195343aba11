"""Signed requests as a game server makes them, written from the README's scheme (not from
the product's code): HMAC-SHA256 under the server's secret of
`METHOD\\nPATH?QUERY\\nTIMESTAMP\\nBODY`, PATH and QUERY exactly as the request line sends
them, the `?` kept when the query is empty."""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["signature", "signed_headers"]


def signature(secret: str, method: str, target: str, timestamp: int | str, body: bytes) -> str:
    """The hex signature of a request to `target` (path, and `?query` when there is one)."""
    path, _, query = target.partition("?")
    message = f"{method}\n{path}?{query}\n{timestamp}\n".encode() + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def signed_headers(secret: str, method: str, target: str, body: bytes, timestamp: int,
                   server: str, prefix: str = "sha256=") -> dict[str, str]:
    """X-Server-Id, X-Timestamp and X-Signature of that request."""
    return {"X-Server-Id": server, "X-Timestamp": str(timestamp),
            "X-Signature": prefix + signature(secret, method, target, timestamp, body)}
