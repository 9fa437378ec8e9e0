"""A tiny pod process for the pod runner's tests: ``python -m tests.e2e.probe_server``.

It reads ``--config FILE`` (a mounted ConfigMap) and the env var ``PROBE_TOKEN`` (from a
Secret), writes ``--data DIR/hello`` (an ``emptyDir``), and serves on
``127.0.0.1:$KEYSHIFT_HTTP_PORT``:

* ``/readyz``: 200 once the config file was read and the token is set, else 503;
* ``/info``: what it was given (config text, env, argv, pid, cwd) as JSON.

SIGTERM makes it print ``SIGTERM`` and exit 0, so tests can tell a graceful stop.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

ENV = ("PROBE_TOKEN", "POD_NAME", "POD_ORDINAL", "GREETING", "HOSTNAME", "DATA_DIR", "VIRTUAL_ENV")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.probe_server")
    parser.add_argument("--config", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)

    config = Path(args.config).read_text()
    Path(args.data, "hello").write_text(f"written by {os.getpid()}\n")
    ready = bool(config) and bool(os.environ.get("PROBE_TOKEN"))
    info: dict[str, Any] = {
        "config": config,
        "env": {k: os.environ.get(k) for k in ENV},
        "argv": sys.argv[1:],
        "tag": args.tag,
        "data": args.data,
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "executable": sys.executable,
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/readyz":
                code, body = (200, b"ok") if ready else (503, b"not ready")
            elif self.path == "/info":
                code, body = 200, json.dumps(info).encode()
            else:
                code, body = 404, b"not found"
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    port = int(os.environ["KEYSHIFT_HTTP_PORT"])
    server = ThreadingHTTPServer((os.environ.get("KEYSHIFT_HTTP_HOST", "127.0.0.1"), port), Handler)

    def on_term(signum: int, frame: FrameType | None) -> None:
        print("SIGTERM", flush=True)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    print(f"serving on {port}, ready={ready}", flush=True)
    server.serve_forever(poll_interval=0.1)
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
