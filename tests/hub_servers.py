"""Loopback stand-ins for the Hugging Face Hub and an Ollama registry, speaking
their protocols as the real clients see them (huggingface_hub, ctx pull),
serving real files from disk.

The Hub (huggingface_hub's routes):
    GET  /api/models/ORG/REPO[/revision/REV]   model_info: sha (the commit), siblings with sizes and lfs
    HEAD /ORG/REPO/resolve/REV/FILE            302 to the "CDN" with X-Repo-Commit, X-Linked-Etag (the
                                               sha256), X-Linked-Size, ETag; 401 RepoNotFound, 404 EntryNotFound
    GET  (the same)                            the same redirect, which the client follows
    GET  /cdn/SHA256                           the bytes, with Range; served as http://localhost:PORT, a
                                               host name that differs from the endpoint's 127.0.0.1, as a
                                               CDN's does (so huggingface_hub never sends it the token)
The registry (Docker distribution, as Ollama's server/images.go pulls):
    GET /v2/NS/NAME/manifests/TAG              the manifest, as stored in an Ollama-layout folder
    GET /v2/NS/NAME/blobs/sha256:HEX           307 to /store/sha256-HEX, which serves the bytes with Range

Both count the body bytes they send (``sent``), can be slowed down
(``rate``, bytes a second, so a test can kill a pull halfway), can be
told to corrupt a blob (``tamper``: its sha256s), to ignore range requests
(``ranges = False``: 200 and the whole file, as some CDNs answer) and to
break a body off after some bytes (``break_at``: the next body longer than
that stops there and the connection closes, once).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

CHUNK = 1 << 20       # bytes a write sends when the body is slowed, tampered with or cut
SENDFILE = 8 << 20    # bytes a sendfile(2) sends otherwise


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, handler):
        super().__init__(("127.0.0.1", 0), handler)
        self.sent = 0
        self.rate: float | None = None
        self.tamper: set[str] = set()
        self.ranges = True
        self.break_at: int | None = None
        self.requests: list[tuple[str, str | None]] = []   # (path, Authorization header) of each request
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args) -> None:  # quiet
        pass

    def reply(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_file(self, path: Path, sha256: str, headers: dict | None = None) -> None:
        """The file's bytes, honouring ``Range: bytes=A-[B]`` (206) as servers do."""
        size = path.stat().st_size
        start, end = 0, size - 1
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "")) if self.server.ranges else None
        status = 200
        if m:
            start, end = int(m[1]), min(int(m[2]) if m[2] else size - 1, size - 1)
            if start >= size:
                return self.reply(416, headers={"Content-Range": f"bytes */{size}"})
            status = 206
        self.send_response(status)
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{sha256}"')
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        self.end_headers()
        if self.command != "HEAD":
            self._body(path, start, end + 1, sha256 in self.server.tamper)

    def _body(self, path: Path, start: int, stop: int, tamper: bool) -> None:
        with self.server.lock:
            cut = self.server.break_at
            if cut is not None and stop - start > cut:
                self.server.break_at = None
                stop, self.close_connection = start + cut, True
        with open(path, "rb") as f:
            if not (tamper or self.server.rate):
                return self._sendfile(f, start, stop)
            f.seek(start)
            pos = start
            while pos < stop:
                chunk = bytearray(f.read(min(CHUNK, stop - pos)))
                if tamper and pos <= stop // 2 < pos + len(chunk):
                    chunk[stop // 2 - pos] ^= 0xFF  # one flipped byte, the size unchanged
                try:
                    self.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    return
                pos += len(chunk)
                with self.server.lock:
                    self.server.sent += len(chunk)
                if self.server.rate:
                    time.sleep(len(chunk) / self.server.rate)

    def _sendfile(self, f, start: int, stop: int) -> None:
        """The bytes as a real server (nginx, a CDN) sends a file: by the kernel, no copy in
        this process, so the server does not take a core from the client it serves."""
        pos = start
        while pos < stop:
            try:
                n = os.sendfile(self.connection.fileno(), f.fileno(), pos, min(SENDFILE, stop - pos))
            except (BrokenPipeError, ConnectionResetError):
                return
            if n == 0:
                return
            pos += n
            with self.server.lock:
                self.server.sent += n


# -- the Hub ---------------------------------------------------------------------------------
class HubHandler(_Handler):
    server: "FakeHub"

    def do_GET(self) -> None:
        path = unquote(urlsplit(self.path).path)
        self.server.requests.append((path, self.headers.get("Authorization")))
        if self.server.refuse_tokens and self.headers.get("Authorization"):
            return self.reply(401, b'{"error":"Invalid credentials in Authorization header"}',
                              {"Content-Type": "application/json"})
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if m:
            return self.model_info(m[1])
        m = re.fullmatch(r"/cdn/([0-9a-f]{64})", path)
        if m and m[1] in self.server.blobs:
            return self.send_file(self.server.blobs[m[1]], m[1])
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            return self.resolve(m[1], m[3])
        self.reply(404, b"not found")

    do_HEAD = do_GET

    def model_info(self, repo: str) -> None:
        files = self.server.repos.get(repo)
        if files is None:
            return self.not_found_repo()
        siblings = [{"rfilename": name, "size": p.stat().st_size, "lfs": {
            "sha256": self.server.sha[name, repo], "size": p.stat().st_size, "pointerSize": 134}}
            for name, p in sorted(files.items())]
        body = json.dumps({"_id": repo, "id": repo, "modelId": repo, "sha": self.server.commit(repo),
                           "private": False, "gated": False, "tags": ["gguf"], "siblings": siblings}).encode()
        self.reply(200, body, {"Content-Type": "application/json"})

    def resolve(self, repo: str, name: str) -> None:
        files = self.server.repos.get(repo)
        if files is None:
            return self.not_found_repo()
        commit = self.server.commit(repo)
        if repo in self.server.gated:
            status = 403 if self.headers.get("Authorization") else 401
            return self.reply(status, b"Access restricted", {"X-Error-Code": "GatedRepo", "X-Error-Message":
                              f"Access to model {repo} is restricted and you are not in the authorized list."})
        if name not in files or name in self.server.hidden:
            return self.reply(404, b"Entry not found", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit})
        sha = self.server.sha[name, repo]
        cdn = f"http://localhost:{self.server.server_address[1]}/cdn/{sha}"
        etag = self.server.etags.get(name, sha)  # a test may make the Hub send another
        self.reply(302, b"", {"Location": cdn, "X-Repo-Commit": commit, "X-Linked-Etag": f'"{etag}"',
                              "X-Linked-Size": files[name].stat().st_size, "ETag": f'"{sha[:40]}"'})

    def not_found_repo(self) -> None:
        # What the Hub answers an anonymous client for a repo it does not show.
        self.reply(401, b"Repository not found", {"X-Error-Code": "RepoNotFound",
                                                  "X-Error-Message": "Repository not found"})


class FakeHub(_Server):
    def __init__(self, repos: dict[str, dict[str, Path]]):
        """repos: ORG/REPO -> {file name in the repo: file on disk}."""
        self.repos = repos
        self.sha = {(name, repo): sha256_of(p) for repo, files in repos.items() for name, p in files.items()}
        self.blobs = {s: repos[repo][name] for (name, repo), s in self.sha.items()}
        self.etags: dict[str, str] = {}  # file name -> the etag to send instead of its sha256
        self.refuse_tokens = False  # a request with a token: 401, as the Hub answers an invalid one
        self.gated: set[str] = set()  # repos whose files need terms accepted (403 with a token, 401 without)
        self.hidden: set[str] = set()  # file names listed by model_info whose resolve/ is a 404
        super().__init__(HubHandler)

    @staticmethod
    def commit(repo: str) -> str:
        return hashlib.sha1(repo.encode()).hexdigest()


# -- the Ollama registry ---------------------------------------------------------------------
class RegistryHandler(_Handler):
    server: "FakeRegistry"

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        m = re.fullmatch(r"/v2/([^/]+)/([^/]+)/manifests/([^/]+)", path)
        if m:
            return self.manifest(*m.groups())
        m = re.fullmatch(r"/v2/([^/]+)/([^/]+)/blobs/sha256:([0-9a-f]{64})", path)
        if m and self.server.blob(m[3]) is not None:
            return self.reply(307, b"", {"Location": f"/store/sha256-{m[3]}"})
        m = re.fullmatch(r"/store/sha256-([0-9a-f]{64})", path)
        if m and self.server.blob(m[1]) is not None:
            return self.send_file(self.server.blob(m[1]), m[1])
        self.reply(404, json.dumps({"errors": [{"code": "BLOB_UNKNOWN"}]}).encode())

    def manifest(self, ns: str, name: str, tag: str) -> None:
        if ns in self.server.private:
            return self.reply(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}',
                              {"WWW-Authenticate": f'Bearer realm="{self.server.url}/token",service="registry"'})
        found = list(self.server.root.glob(f"manifests/*/{ns}/{name}/{tag}"))
        if not found:
            return self.reply(404, json.dumps({"errors": [{"code": "MANIFEST_UNKNOWN",
                                                           "message": "manifest unknown"}]}).encode())
        raw = found[0].read_bytes()
        self.reply(200, raw, {"Content-Type": "application/vnd.docker.distribution.manifest.v2+json",
                              "Docker-Content-Digest": f"sha256:{hashlib.sha256(raw).hexdigest()}"})


class FakeRegistry(_Server):
    def __init__(self, root: Path, private: tuple[str, ...] = ()):
        """Serves the models of an Ollama-layout folder (tests/ollama_layout.py writes one)."""
        self.root = root
        self.private = private
        super().__init__(RegistryHandler)

    def blob(self, hexdigest: str) -> Path | None:
        path = self.root / "blobs" / f"sha256-{hexdigest}"
        return path if path.is_file() else None
