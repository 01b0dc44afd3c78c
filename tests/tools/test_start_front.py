"""start_front serves on a port nobody else can take between choosing it and daphne binding it."""

from __future__ import annotations

import http.server
import threading

import httpx

import tools.processes
from tools.processes import child_env, start_front


class _Impostor(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # the stdlib's name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"impostor")

    def log_message(self, *args):
        pass


def test_the_front_answers_on_its_url_even_when_the_port_once_found_free_is_taken_meanwhile(
    transactional_db, tmp_path, monkeypatch
):
    # Another test's server (here, one that answers every GET with 200) takes a port...
    impostor = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Impostor)
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    taken = impostor.server_address[1]
    # ...just as a search for a free port came upon it: a free port found first and bound by the
    # child later is this race, however rare; the front's socket is bound before daphne starts.
    monkeypatch.setattr(tools.processes, "free_port", lambda: taken)
    try:
        front, url = start_front(child_env(tmp_path), tmp_path)
        try:
            assert url != f"http://127.0.0.1:{taken}"
            response = httpx.get(f"{url}/healthz", timeout=10)
            assert response.status_code == 200 and response.text != "impostor"
            assert front.alive()
        finally:
            front.stop()
    finally:
        impostor.shutdown()
        impostor.server_close()
