"""Every listening socket on this node while a run goes on, for tests/image/cluster.bats: a look every PERIOD_S until
the file STOP exists (at most SECONDS), one JSON line per look into OUT: the host's TCP and UDP listeners (`ss
-Htulpn`), its packet sockets (`ss -H -0 -p`: vblade's, networkd's), and the listeners inside each running cloudbox
guest (busybox `netstat -tulnp` through the guest agent). Standard library and libvirt's Python binding only (run
with cloudbox's interpreter there, /usr/lib/cloudbox/venv/bin/python); tests/helpers/cluster_checks.py `listeners-run`
reads OUT.

    listener_watch.py SECONDS OUT STOP
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path

PERIOD_S = 5.0  # a run's test lasts 5 s or more at quick size; each look costs the nested guest a shell


def _ss(*args: str) -> list[str]:
    r = subprocess.run(["ss", *args], capture_output=True, text=True, timeout=30)
    return [line for line in r.stdout.splitlines() if line.strip()]


def _guest_listeners() -> dict[str, list[str]]:
    """Each running cloudbox guest's `netstat -tulnp` lines (a guest whose agent does not answer: none)."""
    try:
        import libvirt
        import libvirt_qemu
    except ImportError as e:  # said in the look, so the check can tell "no guest" from "not looked"
        return {"(libvirt's Python binding is missing)": [str(e)]}

    out: dict[str, list[str]] = {}
    try:
        conn = libvirt.open("qemu:///system")
    except libvirt.libvirtError:
        return out
    try:
        for dom in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
            if not dom.name().startswith("cloudbox-"):
                continue
            try:
                cmd = {"execute": "guest-exec", "arguments": {"path": "/bin/sh", "capture-output": True,
                       "arg": ["-c", "netstat -tulnp 2>/dev/null || netstat -tuln"]}}
                pid = json.loads(libvirt_qemu.qemuAgentCommand(dom, json.dumps(cmd), 10, 0))["return"]["pid"]
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    st = json.loads(libvirt_qemu.qemuAgentCommand(
                        dom, json.dumps({"execute": "guest-exec-status", "arguments": {"pid": pid}}), 10, 0))["return"]
                    if st.get("exited"):
                        text = base64.b64decode(st.get("out-data", "")).decode(errors="replace")
                        out[dom.name()] = [ln for ln in text.splitlines() if ln.startswith(("tcp", "udp"))]
                        break
                    time.sleep(0.2)
            except (libvirt.libvirtError, KeyError, ValueError):
                continue
    finally:
        conn.close()
    return out


def main(seconds: float, out: Path, stop: Path) -> int:
    deadline = time.monotonic() + seconds
    with out.open("a") as f:
        while time.monotonic() < deadline and not stop.exists():
            look = {"t": time.time(), "inet": _ss("-Htulpn"), "packet": _ss("-H", "-0", "-p"),
                    "guests": _guest_listeners()}
            f.write(json.dumps(look) + "\n")
            f.flush()
            time.sleep(PERIOD_S)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(float(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))
