"""`ctx serve` processes on loopback for the tests (HTTP, gRPC or both), and a
TCP proxy that counts (and can slow down) the bytes between a client and one."""
from __future__ import annotations

import contextlib
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

CTX = [sys.executable, "-m", "ctxengine.cli.main"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ctx_env(home: Path, **extra: str) -> dict:
    """The environment of a child `ctx`: its own CTX_HOME, no token, store or Ollama models from ours."""
    env = {k: v for k, v in os.environ.items() if k not in ("CTX_TOKEN", "CTX_STORE", "OLLAMA_MODELS")}
    return {**env, "CTX_HOME": str(home), "PYTHONSAFEPATH": "1", **extra}


def ctx(*args, home: Path, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CTX, *map(str, args)], capture_output=True, text=True,
                          env=ctx_env(home, **(env or {})), timeout=timeout)


def ctx_imports(*args, watched: tuple[str, ...], home: Path, env: dict | None = None,
                timeout: float = 120) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`ctx ARGS` in a child, as `ctx` runs it, and which of the modules `watched` it had
    imported when it ended (sorted; one kept out by a None in sys.modules is not)."""
    code = ("import os, sys\nfrom ctxengine.cli.main import main\nsys.argv = ['ctx', *sys.argv[1:]]\n"
            "try:\n    main()\nfinally:\n    print('imported:', *sorted(m for m in os.environ['CTX_TEST_WATCHED']"
            ".split(',') if sys.modules.get(m) is not None), file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                       env=ctx_env(home, **(env or {}), CTX_TEST_WATCHED=",".join(watched)))
    last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    assert last.startswith("imported:"), r.stderr
    return r, last.split()[1:]


class CtxServer:
    """``ctx serve`` in a child process: gRPC on a free port (``--port 0``), or
    with ``http=True`` HTTP on a free port (``--grpc-port 0``). The machine's
    own Ollama models are left out unless ``--ollama-models`` or (in ``env``)
    ``OLLAMA_MODELS`` is given."""

    def __init__(self, root: Path, *extra: str, host: str = "127.0.0.1", prefix: tuple[str, ...] = (),
                 env: dict | None = None, timeout: float = 60, http: bool = False):
        self.root = root
        self.store = root / "store"
        self.host = host
        self.port = free_port() if host == "127.0.0.1" else 11436
        self.target = f"{host}:{self.port}"
        self.url = f"http://{host}:{self.port}"
        root.mkdir(parents=True, exist_ok=True)
        self._log = open(root / "serve.log", "w+")
        ports = ["--port", str(self.port), "--grpc-port", "0"] if http else ["--port", "0", "--grpc-port", str(self.port)]
        if "--ollama-models" not in extra and "OLLAMA_MODELS" not in (env or {}):
            extra = (*extra, "--no-ollama")
        cmd = [*prefix, *CTX, "serve", *ports, "--host", host, "--store", str(self.store), *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._log,
                                     env=ctx_env(root / "home", **(env or {})))
        self._wait("ctx serve: HTTP on" if http else "ctx serve: gRPC on", timeout)

    def _wait(self, ready: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready in self.log():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop(check=False)
        raise RuntimeError(f"ctx serve did not start (rc {self.proc.returncode}):\n{self.log()}")

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return (self.root / "serve.log").read_text()

    def stop(self, check: bool = True) -> int:
        """SIGTERM, then (with ``check``) insist it exited cleanly and logged no traceback."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        log = self.log()
        self._log.close()
        if check:
            assert self.proc.returncode == 0 and "Traceback" not in log, \
                f"ctx serve exited with {self.proc.returncode}:\n{log}"
        return self.proc.returncode


@contextlib.contextmanager
def two_hosts(root: Path, *args: str):
    """Two ``ctx serve`` (gRPC, ``args`` each) under ``root``/a and /b; stopped at the end."""
    a = CtxServer(root / "a", *args)
    try:
        b = CtxServer(root / "b", *args)
    except BaseException:
        a.stop(check=False)
        raise
    try:
        yield a, b
    finally:
        try:
            a.stop()
        finally:
            b.stop()


@contextlib.contextmanager
def fleet_hosts(root: Path, fleet_url: str, names: str = "ab"):
    """One ``ctx serve`` on the fleet per name (its CTX_HOST_ID), HTTP, one thread each;
    stopped at the end (a host the test killed is not asked how it exited)."""
    started = []
    try:
        for name in names:
            started.append(CtxServer(root / name, "--fleet", fleet_url, "-t", "1", http=True,
                                     env={"CTX_HOST_ID": name}))
        yield started
    finally:
        for h in started:
            h.stop(check=h.proc.poll() is None)


class ByteProxy:
    """Forwards 127.0.0.1:<port> to ``target``, counting bytes each way;
    ``rate`` (bytes/s, client to server) slows a transfer down to watch it."""

    def __init__(self, target: tuple[str, int], rate: float | None = None):
        self.target = target
        self.rate = rate
        self.up = self.down = 0
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def total(self) -> int:
        return self.up + self.down

    def reset(self) -> None:
        with self._lock:
            self.up = self.down = 0

    def close(self) -> None:
        self._stop.set()
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ, (upstream, "up"))
        sel.register(upstream, selectors.EVENT_READ, (client, "down"))
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(0.2):
                    peer, way = key.data
                    data = key.fileobj.recv(1 << 16)
                    if not data:
                        return
                    if way == "up" and self.rate:
                        time.sleep(len(data) / self.rate)
                    peer.sendall(data)
                    with self._lock:
                        if way == "up":
                            self.up += len(data)
                        else:
                            self.down += len(data)
        except OSError:
            return
        finally:
            sel.close()
            client.close()
            upstream.close()
