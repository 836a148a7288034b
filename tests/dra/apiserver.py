"""A stand-in for the Kubernetes API server, on loopback, for the DRA plugin's tests.

It serves what the kubelet plugin reads: `GET /version` and
`GET /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>`, answering each claim from
the file `<claims-dir>/<ns>/<name>.json` as the API server returns it (read on every request, so
a test changes a claim by writing its file), and a `Status` object with 404 for a claim that is
not there, 401 without the bearer token. Every request is appended to `<claims-dir>/requests.log`.

Usage: apiserver.py CLAIMS_DIR PORT_FILE TOKEN
Writes the port it listens on to PORT_FILE once it is ready.
"""

import json
import os
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CLAIM_PATH = re.compile(
    r"^/apis/resource\.k8s\.io/v1/namespaces/([a-z0-9-]{1,63})/resourceclaims/([a-z0-9.-]{1,253})$"
)


def status(code, reason, message):
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class Handler(BaseHTTPRequestHandler):
    server_version = "apiserver-stand-in"

    def log_message(self, fmt, *args):  # quiet: the test prints what matters
        pass

    def answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        d = self.server.claims_dir
        with open(os.path.join(d, "requests.log"), "a") as log:
            log.write(f"GET {self.path}\n")
        if self.headers.get("Authorization") != f"Bearer {self.server.token}":
            self.answer(401, status(401, "Unauthorized", "Unauthorized"))
            return
        path = self.path.split("?", 1)[0]
        if path == "/version":
            self.answer(200, {"major": "1", "minor": "34", "gitVersion": "v1.34.0"})
            return
        m = CLAIM_PATH.match(path)
        if not m:
            self.answer(404, status(404, "NotFound", f"the server could not find {path}"))
            return
        ns, name = m.groups()
        try:
            with open(os.path.join(d, ns, name + ".json")) as f:
                claim = json.load(f)
        except FileNotFoundError:
            self.answer(
                404,
                status(404, "NotFound", f'resourceclaims.resource.k8s.io "{name}" not found'),
            )
            return
        self.answer(200, claim)


def main():
    claims_dir, port_file, token = sys.argv[1:4]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.claims_dir = claims_dir
    server.token = token
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(tmp, port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
