"""Two hosts in separate network namespaces, joined by a veth pair: a push
crosses a real (virtual) link, and the context continues on the far side.

Needs root and a working ``ip netns``; otherwise skipped, saying why."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from servers import CtxServer, ctx_env

TOKEN = "netns-token"


def _run(*cmd) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=60)


def _netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "not running as root: network namespaces need CAP_SYS_ADMIN"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"ctxprobe{os.getpid()}"
    r = _run("ip", "netns", "add", probe)
    if r.returncode != 0:
        return f"`ip netns add` failed: {r.stderr.strip() or r.stdout.strip()}"
    _run("ip", "netns", "del", probe)
    return None


def _rx_bytes(ns: str) -> int:
    """Bytes received by the namespace's veth end."""
    r = _run("ip", "-n", ns, "-j", "-s", "link", "show", "type", "veth")
    assert r.returncode == 0, r.stderr
    return sum(link["stats64"]["rx"]["bytes"] for link in json.loads(r.stdout))


@pytest.fixture
def namespaces():
    reason = _netns_unavailable()
    if reason:
        pytest.skip(reason)
    pid = os.getpid()
    net = f"10.231.{pid % 250}"
    names = (f"ctxa{pid}", f"ctxb{pid}")
    try:
        for ns in names:
            assert _run("ip", "netns", "add", ns).returncode == 0
        steps = [("ip", "link", "add", f"cxa{pid}", "type", "veth", "peer", "name", f"cxb{pid}"),
                 ("ip", "link", "set", f"cxa{pid}", "netns", names[0]),
                 ("ip", "link", "set", f"cxb{pid}", "netns", names[1])]
        for i, (ns, dev) in enumerate(zip(names, (f"cxa{pid}", f"cxb{pid}"))):
            steps += [("ip", "-n", ns, "addr", "add", f"{net}.{i + 1}/24", "dev", dev),
                      ("ip", "-n", ns, "link", "set", dev, "up"),
                      ("ip", "-n", ns, "link", "set", "lo", "up")]
        for step in steps:
            r = _run(*step)
            assert r.returncode == 0, f"{' '.join(step)}: {r.stderr}"
        yield names, (f"{net}.1", f"{net}.2")
    finally:
        for ns in names:
            _run("ip", "netns", "del", ns)  # takes its end of the veth pair with it


CLIENT = textwrap.dedent("""
    import json, subprocess, sys
    from ctxengine.rpc import Remote
    a_host, b_host, store_a, token = sys.argv[1:5]
    with Remote(a_host, token=token) as a, Remote(b_host, token=token) as b:
        c = a.create("net")
        c.append("Across the link, the conversation goes on:")
        list(c.generate(max_tokens=4, temperature=0.9, seed=3))
        sid = c.snapshot(ref="net")
        on_a = [p.token_id for p in c.generate(max_tokens=8)]
        push = subprocess.run([sys.executable, "-m", "ctxengine.cli.main", "push", "net", b_host,
                               "--store", store_a, "--token", token, "--json"], capture_output=True, text=True)
        assert push.returncode == 0, push.stderr
        r = b.restore("net", name="net")
        on_b = [p.token_id for p in r.generate(max_tokens=8)]
        print(json.dumps({"sid": sid, "push": json.loads(push.stdout), "on_a": on_a, "on_b": on_b}))
""")


def test_push_between_network_namespaces_and_continue(namespaces, tmp_path):
    (ns_a, ns_b), (ip_a, ip_b) = namespaces
    a = CtxServer(tmp_path / "a", "--token", TOKEN, host=ip_a, prefix=("ip", "netns", "exec", ns_a))
    try:
        b = CtxServer(tmp_path / "b", "--token", TOKEN, host=ip_b, prefix=("ip", "netns", "exec", ns_b))
        try:
            rx_before = _rx_bytes(ns_b)
            r = subprocess.run(["ip", "netns", "exec", ns_a, sys.executable, "-c", CLIENT, a.target, b.target,
                                str(a.store), TOKEN], capture_output=True, text=True, timeout=300,
                               env=ctx_env(tmp_path / "home"))
            assert r.returncode == 0, r.stderr
            out = json.loads(r.stdout)
            assert out["push"]["snapshot_id"] == out["sid"] and out["push"]["pages_sent"] > 0
            assert out["on_b"] == out["on_a"] and len(out["on_a"]) == 8
            # the pages crossed the veth link into b's namespace
            assert _rx_bytes(ns_b) - rx_before >= out["push"]["page_bytes"]
        finally:
            b.stop()
    finally:
        a.stop()
