"""uvicorn's HTTP protocols with the app's error shape for what uvicorn answers itself.

A request that is not valid HTTP/1.1 (a request line past the parser's limit, both
Content-Length and Transfer-Encoding, a malformed header or method) never reaches the app:
uvicorn's parser refuses it with a text/plain 400 and closes the connection. These
subclasses answer the same 400 in the JSON shape every other error has
(`{"error": "bad_http_request", "message": ...}`), so a client parses one error format.
`leaderboard serve` runs `JSON_HTTP` (httptools when installed, as uvicorn's `auto`; else
h11), with uvicorn's WebSocket handling off (`ws="none"`: the API has no WebSocket route, and
uvicorn would answer an `Upgrade: websocket` request itself, in text). Another uvicorn takes
the same by `--http app.http.transport:JSON_HTTP --ws none`: `JSON_HTTP` exists whether or
not httptools is installed (`JsonHttpToolsProtocol` only when it is).
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["BAD_HTTP_REQUEST", "JSON_HTTP", "JsonH11Protocol", "JsonHttpToolsProtocol"]

#: The body of the 400 a request that is not valid HTTP gets (the connection is closed).
BAD_HTTP_REQUEST = json.dumps({
    "error": "bad_http_request",
    "message": "the request is not valid HTTP/1.1 (e.g. a request line or URL over 64 KiB, "
               "both Content-Length and Transfer-Encoding, a malformed header or method); "
               "the server closed the connection: fix the request and send it again",
}, separators=(",", ":")).encode()
_HEADERS = [(b"content-type", b"application/json"),
            (b"content-length", str(len(BAD_HTTP_REQUEST)).encode()),
            (b"connection", b"close")]


class JsonH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, its parser's 400 in the JSON error shape."""

    def send_400_response(self, msg: str) -> None:
        event = h11.Response(status_code=400, headers=_HEADERS, reason=b"Bad Request")
        for part in (event, h11.Data(data=BAD_HTTP_REQUEST), h11.EndOfMessage()):
            self.transport.write(self.conn.send(part) or b"")
        self.transport.close()


JSON_HTTP: type[asyncio.Protocol] = JsonH11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is optional; h11 always comes with uvicorn
    pass
else:
    class JsonHttpToolsProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol, its parser's 400 in the JSON error shape."""

        def send_400_response(self, msg: str) -> None:
            headers = [*self.server_state.default_headers, *_HEADERS]
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\n"
                                 + b"".join(name + b": " + value + b"\r\n"
                                            for name, value in headers)
                                 + b"\r\n" + BAD_HTTP_REQUEST)
            self.transport.close()

    JSON_HTTP = JsonHttpToolsProtocol
