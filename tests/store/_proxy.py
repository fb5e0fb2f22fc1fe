"""A small HTTP proxy in front of the moto server that fails chosen requests (real sockets).

It forwards every request to the upstream server and records ``(method, path)``; with
``fail_every=n`` every n-th request is answered ``503 Slow Down`` instead of being forwarded.
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"}


class FaultProxy:
    """Forwards to ``127.0.0.1:upstream``; :attr:`port` is where clients connect."""

    def __init__(self, upstream: int, *, fail_every: int = 0) -> None:
        self.upstream = upstream
        self.fail_every = fail_every
        self.requests: list[tuple[str, str]] = []
        self.failed = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with proxy._lock:
                    proxy.requests.append((self.command, self.path))
                    fail = proxy.fail_every and len(proxy.requests) % proxy.fail_every == 0
                    proxy.failed += bool(fail)
                if fail:
                    payload = b"<Error><Code>SlowDown</Code></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream, timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    reply = conn.getresponse()
                    data = reply.read()
                finally:
                    conn.close()
                self.send_response(reply.status)
                for k, v in reply.getheaders():
                    if k.lower() not in _HOP:
                        self.send_header(k, v)
                length = reply.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def gets(self, suffix: str) -> int:
        """GET requests whose path ends with ``suffix`` (a key's name)."""
        return sum(1 for m, p in self.requests if m == "GET" and p.split("?")[0].endswith(suffix))
