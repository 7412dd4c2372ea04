"""The appliance's firewall rules (mkosi.extra/usr/lib/cloudbox/firewall.nft, loaded by cloudbox-firewall.service)
in network namespaces standing in for a front-end, a campus host with a route to the private subnet through the
front-end's campus address, a back-end on the private link and a guest on a run bridge: the campus host reaches
the campus address and not the private one; the back-end the private address and not the campus one; the guest
the private address through its bridge."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "mkosi.extra" / "usr" / "lib" / "cloudbox" / "firewall.nft"
NS = {"fe": "cbfw-fe", "campus": "cbfw-campus", "be": "cbfw-be", "guest": "cbfw-guest"}
CAMPUS_FE, CAMPUS_HOST = "192.0.2.1", "192.0.2.2"
PRIVATE_FE, PRIVATE_BE = "10.73.0.1", "10.73.0.2"
BRIDGE_FE, GUEST = "169.254.100.1", "169.254.100.2"

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(shutil.which("nft") is None, reason="needs nft (Debian's nftables: make deps-test)"),
]

SERVER = """
import socket, sys, threading
def serve(addr, port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((addr, port)); s.listen()
    while True:
        c, _ = s.accept(); c.sendall(b"hello"); c.close()
for a in sys.argv[1:]:
    addr, port = a.rsplit(":", 1)
    threading.Thread(target=serve, args=(addr, int(port)), daemon=True).start()
print("listening", flush=True)
threading.Event().wait()
"""


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


def in_ns(ns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", NS[ns], *args]


def reaches(ns: str, addr: str, port: int) -> bool:
    code = ("import socket, sys\ntry:\n    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5)\n"
            "    print(s.recv(5).decode())\nexcept OSError as e:\n    print(type(e).__name__)")
    r = subprocess.run(in_ns(ns, sys.executable, "-c", code, addr, str(port)), capture_output=True, text=True,
                       timeout=30)
    return r.stdout.strip() == "hello"


def veth(a_ns: str, a_if: str, a_addr: str, b_ns: str, b_if: str, b_addr: str) -> None:
    sh("ip", "link", "add", a_if, "netns", NS[a_ns], "type", "veth", "peer", "name", b_if, "netns", NS[b_ns])
    for ns, ifname, addr in ((a_ns, a_if, a_addr), (b_ns, b_if, b_addr)):
        sh(*in_ns(ns, "ip", "addr", "add", addr, "dev", ifname))
        sh(*in_ns(ns, "ip", "link", "set", ifname, "up"))


@pytest.fixture
def lab():
    for ns in NS.values():
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        sh("ip", "netns", "add", ns)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
    server = None
    try:
        veth("fe", "campus0", f"{CAMPUS_FE}/24", "campus", "eth0", f"{CAMPUS_HOST}/24")
        veth("fe", "private0", f"{PRIVATE_FE}/24", "be", "eth0", f"{PRIVATE_BE}/24")
        veth("fe", "cbbr7", f"{BRIDGE_FE}/24", "guest", "eth0", f"{GUEST}/24")
        # the campus host routes the private subnet through the front-end's campus address; the back-end routes
        # the campus subnet through its private one; the guest reaches the private address through its bridge
        sh(*in_ns("campus", "ip", "route", "add", "10.73.0.0/24", "via", CAMPUS_FE))
        sh(*in_ns("be", "ip", "route", "add", "192.0.2.0/24", "via", PRIVATE_FE))
        sh(*in_ns("guest", "ip", "route", "add", f"{PRIVATE_FE}/32", "via", BRIDGE_FE))
        server = subprocess.Popen(in_ns("fe", sys.executable, "-c", SERVER, f"{PRIVATE_FE}:7413", "0.0.0.0:2222"),
                                  stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and server.stdout.readline().strip() == "listening"
        yield
    finally:
        if server is not None:
            server.kill()
            server.wait()
        for ns in NS.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        time.sleep(0.1)


def test_each_address_answers_on_its_own_link_only(lab):
    # without the rules Linux answers for any of its addresses on any link: the campus reaches the private server
    assert reaches("campus", PRIVATE_FE, 7413)
    assert reaches("be", CAMPUS_FE, 2222)
    sh(*in_ns("fe", "nft", "-f", str(RULES)))
    assert not reaches("campus", PRIVATE_FE, 7413)  # the enrolment server, netserver, tgtd...: private only
    assert not reaches("campus", PRIVATE_FE, 2222)
    assert reaches("campus", CAMPUS_FE, 2222)  # sshd on the campus address still answers there
    assert reaches("be", PRIVATE_FE, 7413)
    assert not reaches("be", CAMPUS_FE, 2222)
    assert reaches("guest", PRIVATE_FE, 7413)  # a spread run's guest on the front-end, through its run bridge
    assert reaches("fe", PRIVATE_FE, 7413)  # the front-end itself, over loopback
    counters = subprocess.run(in_ns("fe", "nft", "list", "table", "inet", "cloudbox"), capture_output=True,
                              text=True, check=True).stdout
    assert "counter packets 0 " not in counters  # the dropped SYNs were counted


def test_the_rules_load_twice_without_doubling(lab):
    sh(*in_ns("fe", "nft", "-f", str(RULES)))
    sh(*in_ns("fe", "nft", "-f", str(RULES)))  # the service's reload: the table is replaced, not added to
    out = subprocess.run(in_ns("fe", "nft", "list", "ruleset"), capture_output=True, text=True, check=True).stdout
    assert out.count("table inet cloudbox") == 1 and out.count("fib daddr . iif") == 1
    assert not reaches("campus", PRIVATE_FE, 7413)
