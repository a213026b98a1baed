"""`ctx serve`'s shutdown on SIGTERM: a stuck one leaves every thread's stack in the log."""
import sys

from servers import CtxServer

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
