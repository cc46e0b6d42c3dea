"""A real HTTP server on 127.0.0.1, in a thread, serving a temporary folder; and a port
that refuses connections (:func:`refused_port`).

``/a/b/?dl=1`` serves ``ROOT/a/b`` (a file) or, when that is a folder, its one file:
how cloud shares answer their download links. ``.html`` files go out as ``text/html``,
everything else as ``application/octet-stream``; a missing path is a 404. Every request
is recorded, so tests can count downloads. No other address is ever contacted.
"""
import contextlib
import http.server
import os
import socket
import threading
import urllib.parse
from typing import Iterator, List


class _Handler(http.server.BaseHTTPRequestHandler):
    root = '.'
    requests: List[str] = []

    def _file(self):
        path = os.path.join(self.root, urllib.parse.urlparse(self.path).path.strip('/'))
        if os.path.isdir(path):
            files = sorted(os.listdir(path))
            path = os.path.join(path, files[0]) if len(files) == 1 else ''
        return path if os.path.isfile(path) else None

    def do_GET(self):  # noqa: N802 - the http.server API
        self.requests.append(self.path)
        path = self._file()
        if path is None:
            self.send_error(404, 'Not Found')
            return
        with open(path, 'rb') as f:
            data = f.read()
        self.send_response(200)
        self.send_header('Content-Type', 'text/html; charset=utf-8' if path.endswith('.html')
                         else 'application/octet-stream')
        self.send_header('Content-Length', str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # a client that read the head only
            pass

    def log_message(self, *args):  # quiet: the tests read self.requests instead
        pass


@contextlib.contextmanager
def serve_folder(root: str) -> Iterator[tuple]:
    """Serve ``root`` on 127.0.0.1 at a free port; yield ``(base_url, requests)``."""
    handler = type('Handler', (_Handler,), {'root': str(root), 'requests': []})
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f'http://127.0.0.1:{server.server_address[1]}', handler.requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that refuses connections while the block runs.

    The port is bound by this process and not listening: a connection is refused at once,
    and no other process (another pytest-xdist worker) can bind it meanwhile, which a port
    found free and then released cannot promise.
    """
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        yield sock.getsockname()[1]
