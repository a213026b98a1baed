"""`ctx serve`'s shutdown on SIGTERM: a stuck one leaves every thread's stack in the log, and
one with nowhere to write them still ends cleanly."""
import contextlib
import signal
import socket
import subprocess
import sys
import time

from servers import CTX, CtxServer, ctx_env, free_port

# `ctx serve` whose runtime takes 3 s to close, with the stacks due after half a second.
STUCK = ("import sys, time\n"
         "import ctxengine.cli.serve as serve\n"
         "from ctxengine.serving.runtime import Runtime\n"
         "serve.SHUTDOWN_STACKS_S = 0.5\n"
         "close = Runtime.close\n"
         "def slow_close(self):\n"
         "    time.sleep(3)\n"
         "    close(self)\n"
         "Runtime.close = slow_close\n"
         "from ctxengine.cli.main import main\n"
         "sys.exit(main(sys.argv[4:]))\n")  # argv: -c, then the server's own command line


def test_a_stuck_shutdown_logs_every_threads_stack(tmp_path):
    server = CtxServer(tmp_path, prefix=(sys.executable, "-c", STUCK))
    assert server.stop() == 0
    log = server.log()
    assert "most recent call first" in log and "in slow_close" in log, log


def test_a_prompt_shutdown_logs_no_stacks(tmp_path):
    server = CtxServer(tmp_path)
    assert server.stop() == 0
    assert "most recent call first" not in server.log()


def test_a_server_without_stderr_shuts_down_cleanly(tmp_path):
    """Started with stderr closed (`2>&-`: sys.stderr is None, nowhere for stacks to go), it still
    exits 0 on SIGTERM."""
    port = free_port()
    cmd = ["sh", "-c", 'exec "$@" 2>&-', "sh", *CTX, "serve", "--port", "0", "--grpc-port", str(port),
           "--no-ollama", "--store", str(tmp_path / "store")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=ctx_env(tmp_path / "home"))
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.1)
        assert proc.poll() is None, f"ctx serve exited with {proc.returncode} before it listened"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
