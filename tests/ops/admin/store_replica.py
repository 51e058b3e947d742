"""The part of a replica the admin server talks to, over dspark's real runtime state store, without SGLang.

    GET  /ready                -> 200
    GET  /server_info          -> {"internal_states": [{"dspark": the store's report}]}
    POST /set_internal_state   -> the `dspark` key's update checked and installed under one lock, as SGLang's
                                  scheduler loop does: [outcome] (the envelope form) or [true]; 400 / 409 with
                                  {"message": the reason} when the store refuses it

So the admin server's own parsing, ordering and audit can be tested on a real gRPC server in a second; the same
paths through SGLang are tested in tests/integration/test_admin_grpc.py.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from dspark.integration.runtime_state import RuntimeStateStore, VersionConflict, is_envelope
from dspark.models.decoding.settings import VerifySettings
from dspark.models.errors import ConfigError
from dspark.ops.admin.backend import SGLangBackend

GAMMA = 4


class StoreReplica:
    def __init__(self):
        self.store = RuntimeStateStore(VerifySettings(policy="fixed"), GAMMA)
        self.lock = threading.Lock()  # the scheduler's loop: one update at a time
        replica = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/ready":
                    return self.answer(200, None)
                with replica.lock:
                    report = replica.store.report()
                self.answer(200, {"internal_states": [{"dspark": report}]})

            def do_POST(self):
                update = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["server_args"]["dspark"]
                try:
                    with replica.lock:
                        outcome = replica.store.update(update)
                except ConfigError as err:
                    return self.answer(409 if isinstance(err, VersionConflict) else 400, {"message": str(err)})
                self.answer(200, [outcome if is_envelope(update) else True])

            def answer(self, status: int, body) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.backend = SGLangBackend(f"http://127.0.0.1:{self.http.server_port}", timeout_s=30)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()
