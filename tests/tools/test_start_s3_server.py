"""start_s3_server serves on a port its rclone really listens on, even when the port once found
free was taken before rclone could bind it."""

from __future__ import annotations

import http.server
import threading

import httpx

import tools.processes
from pods.providers.local import free_port
from tools.processes import start_s3_server


class _Impostor(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # the stdlib's name
        self.send_response(403)  # what rclone answers an unsigned GET: it looks like rclone
        self.end_headers()
        self.wfile.write(b"impostor")

    def log_message(self, *args):
        pass


def test_rclone_is_started_again_on_another_port_when_the_one_found_free_was_taken(tmp_path, monkeypatch):
    impostor = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Impostor)
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    taken = impostor.server_address[1]
    ports = [taken]  # the first port found free is taken by the time rclone binds it; then any free one
    monkeypatch.setattr(tools.processes, "free_port", lambda: ports.pop(0) if ports else free_port())
    (tmp_path / "logs").mkdir()
    try:
        server, env = start_s3_server(tmp_path / "s3", tmp_path / "logs")
        try:
            url = env["STORAGE_S3_ENDPOINT_URL"]
            assert url != f"http://127.0.0.1:{taken}" and server.alive()
            assert httpx.get(url, timeout=10).text != "impostor"
        finally:
            server.stop()
    finally:
        impostor.shutdown()
        impostor.server_close()
