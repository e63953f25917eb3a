"""The lifecycle the test servers share: a socketserver-style server (`serve_forever`, `shutdown`,
`server_close`) served from a daemon thread, `start()`/`stop()` or `with`."""
from __future__ import annotations

import threading


class ServedInThread:
    """Mixin: a subclass's `start()` makes its server and returns `self._serve(server, name)`;
    `stop()` shuts it down (a server made but never started is only closed)."""

    _server = None
    _thread: threading.Thread | None = None

    def _serve_http(self, server_class, handler_class, name: str):
        """A `server_class` HTTP server on (`self.host`, `self.port`) whose handlers find this object
        as the server's `owner`, served from a thread; `self.port` becomes the port it got (0: a free one)."""
        server = server_class((self.host, self.port), handler_class)
        server.owner = self
        self.port = server.server_address[1]
        return self._serve(server, name)

    def _serve(self, server, name: str):
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), name=name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=10)
        if self._server is not None:
            self._server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
