"""What tests/image/cluster.bats checks in the cluster's JSON output: the node run's results, the node list, the
image copies. Standard library only: it runs with Debian's python3 on the test host (watch-state on the front-end).

    cluster_checks.py run RUN_JSON PROPAGATIONS_JSON [FE_TEST...]
                                                       the last run of `results export --format json`, with
                                                       FE_TEST (default tcp-stream-fe) on both sides
    cluster_checks.py nfs-run RUN_JSON                 the last run: be1's guests and host on fe1's NFS export
    cluster_checks.py iperf3-run RUN_JSON              the last run: be1's two guests' iperf3 to its host and fe1
    cluster_checks.py mpi-run RUN_JSON                 the last run: an MPI-IO job across be1's two guests
    cluster_checks.py fiocs-run RUN_JSON               the last run: fio's client/server job across be1's two guests
    cluster_checks.py host-raid RUN_JSON               the last run: the guest's one disk on the host's RAID 0
    cluster_checks.py spread-run RUN_JSON              the last run: one guest on fe1 and one on be1, started
                                                       together, each one's figure and their sum (on one NFS
                                                       export fe1 serves, for an NFS profile)
    cluster_checks.py volume-run RUN_JSON SCHEME ATTACH [NODE]
                                                       the last run: a SCHEME volume attached by ATTACH, the guest
                                                       beside the host domain on it (on NODE, served by the front-end)
    cluster_checks.py node-state NAME < NODES_JSON     the state `node list --json` shows for node NAME
    cluster_checks.py wrong-code CODE                  a well-formed join code other than CODE
    cluster_checks.py propagation PROPAGATIONS_JSON    the first real image copy, in words
    cluster_checks.py listeners ALLOW_MD NODE < SS      `ss -Htulpn` of NODE against the allow-list in ALLOW_MD
    cluster_checks.py listeners-run ALLOW_MD NODE PRIVATE_SUBNET < WATCH
                                                       what listener_watch.py saw on NODE during a run (host,
                                                       packet sockets, guests) against every row of ALLOW_MD
    cluster_checks.py watch-state NAME DB SECONDS       on the front-end: NAME's state in the registry DB every
                                                       0.5 s for SECONDS, each line "<this machine's clock> <state>"
"""

from __future__ import annotations

import ipaddress
import json
import random
import re
import sqlite3
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The join code's alphabet (cloudbox.core.cluster.registry.CODE_ALPHABET): a wrong code must still be well-formed.
CODE_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


class CheckFailed(Exception):
    """A fact the cluster should show and does not; the message names it with the value found."""


def check(ok: object, what: str, found: object) -> None:
    if not ok:
        raise CheckFailed(f"{what}; found: {found!r}")


def first_copy(props: list[dict[str, Any]], node: str | None = None) -> dict[str, Any]:
    """The first image copy that was not served from the node's cache."""
    copies = [p for p in props if not p["cached"] and (node is None or p["node"] == node)]
    check(copies, f"an image copy to {node or 'a node'} that was not cached", props)
    return copies[0]


def check_run(run_json: Path, props_json: Path, fe_tests: list[str]) -> str:
    """The front-end's run on be1: completed, both nodes named, nested KVM, the storage and network tests on both
    sides (guest and baseline), Study A's guest -> front-end tests (fe_tests), the node's provenance, the image
    copied."""
    run = json.loads(run_json.read_text())["runs"][-1]
    props = json.loads(props_json.read_text())
    prov = run["provenance"]
    check(run["state"] == "completed", "the run completed", (run["state"], run["reason"]))
    check(run["node"] == "be1", "the run ran on be1", run["node"])
    check(prov["nodes"] == {"front-end": "fe1", "back-end": "be1"}, "provenance names both nodes", prov["nodes"])
    check(prov["host"] == "be1" and prov["controller"]["host"] == "fe1", "host be1, controller fe1",
          (prov["host"], prov["controller"]))
    acc = prov["accelerator"]
    check(acc["name"] in ("kvm", "nested-kvm") and acc["nested"], "the guest ran under nested KVM", acc)
    # The node's own provenance came through: how many launches its guest needed (a second one is announced).
    check(prov.get("boot_attempts") in (1, 2), "boot_attempts is 1 or 2", prov.get("boot_attempts"))
    sides = {(m["side"], m["test"]) for m in run["measurements"]}
    tests = {t for _, t in sides}
    check({s for s, _ in sides} >= {"guest", "baseline"}, "guest and baseline measurements", sides)
    check(any(t.startswith("seq-") or "write" in t for t in tests), "a storage test", tests)
    check(any("tcp" in t for t in tests), "a TCP network test", tests)
    # Study A's guest -> other host: the guest on be1's private bridge to the front-end, beside be1's host -> fe1.
    for t in fe_tests:
        check(("guest", t) in sides and ("baseline", t) in sides, f"{t} on both sides", sorted(sides))
    for m in run["measurements"]:
        if m["side"] == "baseline" and m["test"].endswith("-fe"):
            check("private-network" in m["labels"] and "nested" not in m["labels"],
                  "a baseline to fe1 is labelled private-network, not nested", m)
            check("virtualized-host" in m["labels"], "be1's own baseline says it is a VM", m)
        if m["side"] == "guest":
            check("nested" in m["labels"], "a guest measurement is labelled nested", m)
    net = prov["private_network"]  # the NIC's own knobs are the profile's
    check(net["peer"] == "10.73.0.1" and net["bridge"] == "cbpriv0" and net["mtu"] == 9000,
          "the private network: peer 10.73.0.1, bridge cbpriv0, MTU 9000", net)
    check(net["guest_ip"].startswith("10.73.0.") and net["guest_ip"] != net["host_ip"],
          "the guest has its own private address", net)
    check(prov["peer"]["peer"] == "10.73.0.1" and prov["peer"]["peer_netperf_port"] > 0,
          "the peer is fe1 with its netserver port", prov["peer"])
    copy = first_copy(props, "be1")
    check(copy["bytes"] > 0 and copy["mbps"] > 0, "the image copy to be1 moved bytes", copy)
    fe_tx = next(m["value"] for m in run["measurements"] if (m["side"], m["test"]) == ("guest", "tcp-stream-fe"))
    return (f"{len(run['measurements'])} measurements; guest boot attempts {prov['boot_attempts']}; "
            f"guest -> fe1 {fe_tx:.0f} Mbit/s; image copy {copy['bytes'] / 1e6:.1f} MB at {copy['mbps']:.1f} MB/s")


def watch_state(name: str, db: str, seconds: float) -> None:
    conn = sqlite3.connect(db, timeout=5)
    end = time.time() + seconds
    while time.time() < end:
        row = conn.execute("SELECT state FROM nodes WHERE name = ?", (name,)).fetchone()
        print(f"{time.time():.2f} {row[0] if row else '?'}", flush=True)
        time.sleep(0.5)


def node_state(nodes: list[dict[str, Any]], name: str) -> str:
    return next((n["shown_state"] for n in nodes if n["name"] == name), "?")


def wrong_code(code: str) -> str:
    while True:
        wrong = "-".join("".join(random.choice(CODE_ALPHABET) for _ in range(4)) for _ in range(4))
        if wrong != code:
            return wrong


def propagation(props_json: Path) -> str:
    p = first_copy(json.loads(props_json.read_text()))
    return (f"{p['bytes'] / 1e6:.1f} MB in {p['seconds']:.2f} s = {p['mbps']:.1f} MB/s "
            f"(SHA-256 check on the node {p['verify_seconds']:.2f} s)")


@dataclass(frozen=True)
class Allowed:
    """One protocol of a row of docs/cluster.md's listeners table."""

    proto: str  # tcp, udp, packet
    port: str  # a number, "any", or for a packet socket the protocol ss names ("aoe")
    process: str  # as ss (or the guest's netstat) names it
    bound: str  # any, loopback, private address, run bridge, ... ("guest: ..." inside a guest)
    idle: bool  # open on an idle node


def allow_list(md: str) -> list[Allowed]:
    """Every row of docs/cluster.md's "Listening sockets" table, one Allowed per protocol of a row."""
    m = re.search(r"<!-- listeners:begin -->(.*?)<!-- listeners:end -->", md, re.S)
    check(m, "docs/cluster.md has the listeners table", None)
    rows = []
    for line in m.group(1).splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) < 5 or cells[4] not in ("yes", "no"):
            continue
        rows += [Allowed(proto, cells[1], cells[2], cells[3], cells[4] == "yes")
                 for proto in re.split(r",\s*", cells[0])]
    check(Allowed("tcp", "22", "sshd", "any", True) in rows, "the allow-list names sshd", rows)
    return rows


def _where(addr: str, private: str) -> set[str]:
    """The table's words for where a socket bound to `addr` listens."""
    if addr in ("0.0.0.0", "::", "*"):
        return {"any"}
    ip = ipaddress.ip_address(addr)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:  # a dual-stack socket's IPv4 address
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return {"loopback"}
    if ip in ipaddress.ip_network(private):
        return {"private address"}
    if ip in ipaddress.ip_network("169.254.0.0/16"):
        return {"run bridge"}
    return {"another address"}


def _allowed(rows: list[Allowed], proto: str, addr: str, port: str, proc: str, private: str, *, guest: bool,
             idle_only: bool) -> bool:
    where = _where(addr, private)
    for r in rows:
        if idle_only and not r.idle:
            continue
        if r.bound.startswith("guest:") != guest or r.proto != proto or r.process != proc:
            continue
        if r.port not in ("any", port):
            continue
        bound = set(re.split(r",\s*|\s+or\s+", r.bound.removeprefix("guest:").strip()))  # "loopback, ... or ..."
        if "any" in bound or bound & where:
            return True
    return False


def _inet(line: str) -> tuple[str, str, str, str] | None:
    """(protocol, address, port, process) of an `ss -Htulpn` line."""
    f = line.split()
    if len(f) < 5:
        return None
    addr, _, port = f[4].rpartition(":")
    proc = m.group(1) if (m := re.search(r'users:\(\("([^"]+)"', line)) else "-"
    return f[0], addr.strip("[]").split("%")[0], port, proc


def listeners(allow_md: Path, node: str, ss: str) -> str:
    """Every socket `ss -Htulpn` lists on an idle NODE is an idle row of the allow-list; the answer names each
    offender with its address and process."""
    allowed = allow_list(allow_md.read_text())
    seen, offenders = 0, []
    for line in ss.splitlines():
        if (got := _inet(line)) is None:
            continue
        seen += 1
        proto, addr, port, proc = got
        loopback = addr.startswith("127.") or addr == "::1"
        if not any(r.idle and r.proto == proto and r.port == port and r.process == proc and not r.bound.startswith(
                "guest:") and (r.bound != "loopback" or loopback) for r in allowed):
            offenders.append(f"{proto} {addr}:{port} ({proc})")
    check(seen, f"{node} listens on something (sshd at least)", ss)
    check(not offenders, f"{node}: every listening socket is on the allow-list in docs/cluster.md (\"Listening "
          "sockets\"); these are not", offenders)
    return f"{node}: {seen} listening sockets, all on the allow-list"


def listeners_run(allow_md: Path, node: str, private: str, watch: str) -> str:
    """Every socket listener_watch.py saw on NODE while a run went on (the host's TCP and UDP listeners, its packet
    sockets, each guest's listeners) is a row of the allow-list, idle or not, with the address it may be bound to
    (`private`: the private network's subnet); the answer names each offender once, with where it was seen."""
    allowed = allow_list(allow_md.read_text())
    looks = [json.loads(line) for line in watch.splitlines() if line.strip()]
    check(looks, f"{node}: the listeners were watched during the run", watch[:200])
    offenders: dict[str, str] = {}
    guests: set[str] = set()
    sockets = 0
    # ss shows a socket without its process at moments (being made, or its process gone): the one seen on that port
    owner = {(got[0], got[2]): got[3] for look in looks for line in look["inet"]
             if (got := _inet(line)) is not None and got[3] != "-"}
    for look in looks:
        inet = [got for line in look["inet"] if (got := _inet(line)) is not None]
        for proto, addr, port, proc in inet:
            sockets += 1
            proc = owner.get((proto, port), proc) if proc == "-" else proc
            if not _allowed(allowed, proto, addr, port, proc, private, guest=False, idle_only=False):
                offenders.setdefault(f"{proto} {addr}:{port} ({proc})", "host")
        for line in look["packet"]:
            f = line.split()
            local = next((x for x in f[1:] if ":" in x), "")
            kind = local.partition(":")[0]
            kind = "any" if kind in ("*", "") else kind
            proc = m.group(1) if (m := re.search(r'users:\(\("([^"]+)"', line)) else "-"
            sockets += 1
            if not any(r.proto == "packet" and r.process == proc and r.port in ("any", kind) for r in allowed):
                offenders.setdefault(f"packet {local} ({proc})", "host")
        for name, lines in look["guests"].items():
            guests.add(name)
            for line in lines:  # busybox netstat: proto recv-q send-q local foreign [state] pid/program
                f = line.split()
                addr, _, port = f[3].rpartition(":")
                proc = f[-1].partition("/")[2] if "/" in f[-1] else "-"
                sockets += 1
                if not _allowed(allowed, f[0].rstrip("6"), addr.strip("[]") or "::", port, proc, private,
                                guest=True, idle_only=False):
                    offenders.setdefault(f"{f[0].rstrip('6')} {addr}:{port} ({proc})", f"guest {name}")
    check(not offenders, f"{node}: every socket open during the run is on the allow-list in docs/cluster.md "
          "(\"Listening sockets\"); these are not", [f"{k} in {v}" for k, v in offenders.items()])
    return (f"{node}: {len(looks)} looks during the run, {sockets} sockets"
            + (f" (guests {', '.join(sorted(guests))})" if guests else " (no guest seen)") + ", all on the allow-list")


def check_nfs_run(run_json: Path) -> str:
    """The front-end's NFS run of two guests on be1: fe1 served the export on its private address, be1's guests and
    be1's host mounted it over the 9000-byte link (the mount lines recorded), the baseline is be1's host on the
    same export with a process per guest, each guest's figure and their sum stored, and fe1's server wrote what
    both sides wrote. be1 has one vCPU: the guests' two vCPUs share it (--cpu-overcommit 2), and their figures say
    so; the baseline's do not."""
    run = json.loads(run_json.read_text())["runs"][-1]
    prov = run["provenance"]
    check(run["state"] == "completed", "the NFS run completed", (run["state"], run["reason"]))
    check(run["node"] == "be1" and run["profile_name"] == "nfs-async-tcp-9000", "nfs-async-tcp-9000 ran on be1",
          (run["node"], run["profile_name"]))
    vol = prov["volume"]
    check(vol["scheme"] == "nfs" and "10.73.0.1" in vol["server"], "fe1 (10.73.0.1) served the export", vol)
    for key, who in (("mount", "be1's guest"), ("host_mount", "be1's host")):
        line = vol.get(key) or ""
        check(" nfs4 " in line and "addr=10.73.0.1" in line and "vers=4.2" in line,
              f"{who} mounted fe1's export with NFSv4.2", line)
    flags = set(((vol.get("host_mount") or "").split() + ["", "", "", ""])[3].split(","))
    check({"nosuid", "nodev", "noexec"} <= flags, "be1's host mounted the export nosuid,nodev,noexec",
          vol.get("host_mount"))
    check("same export mounted by this back-end's host" in vol["baseline"], "the baseline is be1's own mount",
          vol["baseline"])
    net = prov["private_network"]
    check(net["mtu"] == 9000 and net["bridge"] == "cbpriv0", "the guests on cbpriv0 at MTU 9000", net)
    g = prov["guests"]
    check(g["count"] == 2 and (g.get("vcpus"), g.get("host_cpus")) == (2, 1), "two 1-vCPU guests on be1's one CPU",
          (g["count"], g.get("vcpus"), g.get("host_cpus")))
    rows = [m for m in run["measurements"] if m["test"] == "seq-write-64k" and m["metric"] == "MB/s"]
    total = {m["side"]: m for m in rows if m.get("instance") is None}
    check(set(total) == {"guest", "baseline"}, "seq-write-64k on both sides", sorted(total))
    out = []
    for side in ("guest", "baseline"):
        each = sorted((m["instance"], m["value"]) for m in rows if m["side"] == side and m.get("instance") is not None)
        check([k for k, _ in each] == [1, 2] and all(v > 0 for _, v in each), f"{side}: a figure per guest", each)
        check(abs(total[side]["value"] - sum(v for _, v in each)) < 1e-6, f"{side}: the run's row is the sum",
              (total[side]["value"], each))
        out.append(f"{side} {' + '.join(f'{v:.1f}' for _, v in each)} = {total[side]['value']:.1f} MB/s")
    check("volume-from-host" in total["baseline"]["labels"], "the baseline is labelled volume-from-host",
          total["baseline"]["labels"])
    check("vcpu-overcommit" in total["guest"]["labels"] and "vcpu-overcommit" not in total["baseline"]["labels"],
          "the guests' figures, not the baseline's, carry vcpu-overcommit",
          (total["guest"]["labels"], total["baseline"]["labels"]))
    written = vol.get("server_bytes_written") or 0
    check(written >= 4 * 16 * 1024 * 1024, "fe1's ganesha wrote both sides' 2 x 16 MiB", written)
    check((vol.get("server_device") or "").startswith("fe1:"), "fe1's disk under the export was sampled",
          vol.get("server_device"))
    return f"NFS from fe1, 2 guests on be1: {'; '.join(out)}; ganesha wrote {written / 2**20:.0f} MiB"


def check_iperf3_run(run_json: Path) -> str:
    """Two guests on be1 with iperf3: each guest's figure to be1's host and to fe1 (an iperf3 server per guest on
    fe1's private address), stored per guest with the run's sum."""
    run = json.loads(run_json.read_text())["runs"][-1]
    check(run["state"] == "completed", "the iperf3 run completed", (run["state"], run["reason"]))
    peer = run["provenance"].get("peer") or {}
    check(len(peer.get("peer_iperf3_ports") or []) == 2, "fe1 served an iperf3 port per guest", peer)
    out = []
    for test in ("iperf3-tx", "iperf3-tx-fe"):
        rows = [m for m in run["measurements"] if m["test"] == test and m["side"] == "guest"
                and m["metric"] == "Mbit/s"]
        each = sorted((m["instance"], m["value"]) for m in rows if m.get("instance") is not None)
        check([k for k, _ in each] == [1, 2] and all(v > 0 for _, v in each), f"{test}: a figure per guest", each)
        out.append(f"{test} {' + '.join(f'{v:.0f}' for _, v in each)} Mbit/s")
    return f"iperf3 from 2 guests on be1: {'; '.join(out)}"


SPREAD_SKEW_BOUND_S = 1.0  # two nested TCG guests on two TCG nodes, released through fe1's coordination channels


def check_spread_run(run_json: Path) -> str:
    """The front-end's run of two guests spread over itself and be1: each place ran its own part (its run there,
    its host, its clock measured), the guests numbered g1 on fe1 and g2 on be1, each one's figure and the sum as the
    run's row on both sides, the start skew across the two nodes recorded and under SPREAD_SKEW_BOUND_S."""
    run = json.loads(run_json.read_text())["runs"][-1]
    prov = run["provenance"]
    check(run["state"] == "completed", "the spread run completed", (run["state"], run["reason"]))
    check(run["node"] == "local,be1", "the run's places are local and be1", run["node"])
    g = prov["guests"]
    places = {p["name"]: p for p in g["places"]}
    check(list(places) == ["local", "be1"] and all(p["guests"] == 1 for p in places.values()),
          "one guest on each place", g["places"])
    check(places["local"]["host"] == "fe1" and places["be1"]["host"] == "be1", "each part ran on its own host",
          {k: p.get("host") for k, p in places.items()})
    rtt = places["be1"].get("clock_rtt_s")
    check(rtt is not None and rtt < 1.0, "be1's clock measured over its channel in under 1 s", rtt)
    check([x.get("place") for x in g["guests"]] == ["local", "be1"], "g1 on fe1 and g2 on be1", g["guests"])
    mix = run["profile_name"].split("+")
    if len(mix) > 1:  # a mixed run: guest k ran the k-th profile wherever it landed, as libvirt there says
        check([x.get("profile") for x in g["guests"]] == mix, "each guest ran its profile of the mix", g["guests"])
        xml = g.get("domain_xml") or {}
        check(sorted(xml) == sorted(mix), "each profile's domain XML recorded", sorted(xml))
        for name in mix:
            bus = tomllib.loads(g["profiles"][name])["disk"]["bus"]
            want = {"virtio-blk": "virtio", "scsi-lsi": "scsi", "ide": "ide"}.get(bus, "?")
            check(f"bus='{want}'" in xml[name], f"{name}'s guest on bus {want}", name)
    out = []
    tests = [(t, u) for t, u in (("seq-write-64k", "MB/s"), ("tcp-stream", "Mbit/s"))
             if any(m["test"] == t for m in run["measurements"])]
    check(tests, "seq-write-64k or tcp-stream ran", sorted({m["test"] for m in run["measurements"]}))
    vol = prov.get("volume") or {}
    if vol.get("scheme") == "nfs":  # one export fe1 served, every guest's own file in it, both hosts' mounts too
        check("10.73.0.1" in vol.get("server", ""), "fe1 (10.73.0.1) served the export", vol.get("server"))
        files = [json.loads(m["raw"])["jobs"][0]["job options"]["filename"] for m in run["measurements"]
                 if m["side"] == "guest" and m.get("instance") is not None]
        check(sorted(files) == ["/mnt/nfs/cloudbox-g1.dat", "/mnt/nfs/cloudbox-g2.dat"],
              "g1 and g2 on files of their own in the one export", files)
        written = vol.get("server_bytes_written") or 0
        check(written >= 4 * 16 * 1024 * 1024, "fe1's ganesha wrote both guests' and both hosts' 16 MiB", written)
        out.append(f"ganesha wrote {written / 2**20:.0f} MiB")
    for test, unit in tests:
        for side in ("guest", "baseline"):
            rows = [m for m in run["measurements"] if m["test"] == test and m["side"] == side and m["metric"] == unit]
            each = sorted((m["instance"], m["value"]) for m in rows if m.get("instance") is not None)
            total = [m["value"] for m in rows if m.get("instance") is None]
            check([k for k, _ in each] == [1, 2] and all(v > 0 for _, v in each), f"{test} {side}: a figure per place",
                  each)
            check(len(total) == 1 and abs(total[0] - sum(v for _, v in each)) < 1e-6,
                  f"{test} {side}: the run's row is the sum", (total, each))
            out.append(f"{test} {side} {' + '.join(f'{v:.1f}' for _, v in each)} = {total[0]:.1f} {unit}")
        skew = g["skew_s"].get(test)
        check(skew is not None and 0 <= skew < SPREAD_SKEW_BOUND_S,
              f"{test}: a start skew under {SPREAD_SKEW_BOUND_S} s", skew)
        out.append(f"{test} start skew {skew * 1000:.0f} ms")
    return (f"spread over fe1 and be1 ({run['profile_name']}): {'; '.join(out)}; "
            f"be1's clock {places['be1']['clock_offset_s'] * 1000:+.1f} ms (round trip {rtt * 1000:.1f} ms)")


def check_mpi_run(run_json: Path) -> str:
    """The front-end's MPI run on be1: one Open MPI job with a rank in each of be1's two guests (mpirun in the
    first, over dropbear on be1's bridge), a file per process on each guest's own disk, its write and read phases
    stored as the job's figure (at most its ranks' sum) beside each rank's, and bare metal's two processes on be1's
    disk. be1's one CPU runs both guests (--cpu-overcommit 2): the guests' figures say so."""
    run = json.loads(run_json.read_text())["runs"][-1]
    prov = run["provenance"]
    check(run["state"] == "completed", "the MPI run completed", (run["state"], run["reason"]))
    check(run["node"] == "be1" and prov["nodes"]["back-end"] == "be1", "the run ran on be1",
          (run["node"], prov.get("nodes")))
    g = prov["guests"]
    check(g["count"] == 2 and (g.get("vcpus"), g.get("host_cpus")) == (2, 1), "two 1-vCPU guests on be1's one CPU",
          (g["count"], g.get("vcpus"), g.get("host_cpus")))
    out = []
    for side in ("guest", "baseline"):
        for metric in ("MB/s", "read MB/s"):
            rows = [m for m in run["measurements"] if m["test"] == "mpiio-fpp-1m" and m["side"] == side
                    and m["metric"] == metric]
            each = sorted((m["instance"], m["value"]) for m in rows if m.get("instance") is not None)
            job = [m for m in rows if m.get("instance") is None]
            check([k for k, _ in each] == [1, 2] and all(v > 0 for _, v in each), f"{side} {metric}: a figure per rank",
                  each)
            check(len(job) == 1 and 0 < job[0]["value"] <= sum(v for _, v in each) * 1.0001,
                  f"{side} {metric}: the job's figure, at most its ranks' sum", (job, each))
            if side == "guest" and metric == "MB/s":
                check("vcpu-overcommit" in job[0]["labels"], "the guests' job carries vcpu-overcommit",
                      job[0]["labels"])
                docs = [json.loads(line) for line in job[0]["raw"].splitlines() if line.startswith("{")]
                hosts = [rk["host"] for rk in docs[0]["ops"][0]["ranks"]] if docs else []
                check(hosts == ["cloudbox-g1", "cloudbox-g2"], "a rank in each guest, in order", hosts)
                check(docs[0]["mpi"].startswith("Open MPI"), "Open MPI ran the job", docs[0].get("mpi"))
            out.append(f"{side} {metric} {job[0]['value']:.1f} ({' + '.join(f'{v:.1f}' for _, v in each)})")
    return "MPI-IO across be1's two guests, a file per process: " + "; ".join(out)


def check_fiocs_run(run_json: Path) -> str:
    """The front-end's fio client/server run on be1: the job's figure (fio's "All clients") beside each guest's
    server, from be1's two guests."""
    run = json.loads(run_json.read_text())["runs"][-1]
    check(run["state"] == "completed", "the fio client/server run completed", (run["state"], run["reason"]))
    check(run["node"] == "be1", "the run ran on be1", run["node"])
    rows = [m for m in run["measurements"] if m["test"] == "fiocs-seq-write-64k" and m["side"] == "guest"
            and m["metric"] == "MB/s"]
    each = sorted((m["instance"], m["value"]) for m in rows if m.get("instance") is not None)
    job = [m["value"] for m in rows if m.get("instance") is None]
    check([k for k, _ in each] == [1, 2] and all(v > 0 for _, v in each), "a figure per guest's fio --server", each)
    check(len(job) == 1 and job[0] > 0, "the job's figure (All clients)", job)
    return f"fio client/server across be1's two guests: {job[0]:.1f} MB/s ({' + '.join(f'{v:.1f}' for _, v in each)})"


def check_host_raid(run_json: Path) -> str:
    """The last run was virtio-raid0-host: the host built a RAID 0 (64 KiB chunks) over three loop devices, the
    guest had that array as its one disk, both sides wrote through it and every member took its share."""
    run = json.loads(run_json.read_text())["runs"][-1]
    prov = run["provenance"]
    check(run["state"] == "completed", "the host RAID run completed", (run["state"], run["reason"]))
    raid = prov.get("raid") or {}
    check((raid.get("where"), raid.get("level"), raid.get("chunk_kib")) == ("host", "0", 64),
          "the host built a RAID 0 with 64 KiB chunks", raid)
    members = raid.get("members") or []
    check(len(members) == 3 and all(re.fullmatch(r"loop\d+", m) for m in members), "three loop devices", members)
    check(re.search(rf"^{raid['device'].rsplit('/', 1)[-1]} : active raid0 ", raid.get("mdstat", ""), re.M),
          "/proc/mdstat showed the array active", raid.get("mdstat"))
    check(prov["backing"]["device"] == raid["device"].rsplit("/", 1)[-1], "the store (and the sampler) is the array",
          prov["backing"])
    check(prov["domain_xml"].count("<disk ") == 1, "the guest had one disk", prov["domain_xml"].count("<disk "))
    by_side = {m["side"]: m for m in run["measurements"] if m["test"] == "seq-write-64k" and m["metric"] == "MB/s"}
    check(set(by_side) == {"guest", "baseline"}, "seq-write-64k on both sides", sorted(by_side))
    # both sides wrote 16 MiB through the array: each member at least a third of it, in 64 KiB chunks
    share = 2 * (16 * 1024 // 64 // 3) * 128
    written = raid.get("sectors_written") or {}
    check(set(written) == set(members) and all(v >= share for v in written.values()),
          f"every member took at least {share} sectors", written)
    g, b = by_side["guest"]["value"], by_side["baseline"]["value"]
    return (f"host RAID 0 over {', '.join(members)}: guest {g:.1f} MB/s, host {b:.1f} MB/s ({100 * g / b:.0f}%); "
            f"sectors per member {', '.join(str(written[m]) for m in members)}")


def check_volume_run(run_json: Path, scheme: str, attach: str, node: str = "") -> str:
    """The last run measured a network volume over `scheme`, attached by `attach`: completed, the guest's rows beside
    the host domain's on the same volume (labelled volume-from-host; through the host's own initiator when it
    attached it), the server wrote what both sides wrote. With `node`, the run ran there and the front-end served."""
    run = json.loads(run_json.read_text())["runs"][-1]
    prov = run["provenance"]
    check(run["state"] == "completed", "the run completed", (run["state"], run["reason"]))
    vol = prov.get("volume") or {}
    check((vol.get("scheme"), vol.get("attach")) == (scheme, attach), f"a {scheme} volume attached by {attach}", vol)
    rows = {(m["side"], m["test"]): m for m in run["measurements"] if m["metric"] in ("MB/s", "IOPS")}
    guest = [m for (side, _), m in rows.items() if side == "guest"]
    base = [m for (side, _), m in rows.items() if side == "baseline"]
    check(guest and all(m["value"] > 0 for m in guest), "the guest measured the volume", guest)
    check(base and all("volume-from-host" in m["labels"] for m in base), "the host domain measured the same volume",
          base)
    if attach == "host" or vol.get("host_device"):
        check(all("host-initiator" in m["labels"] for m in base), "the baseline ran on the host's attachment", base)
        check(vol.get("host_device", "").startswith("/dev/") and vol.get("initiator"), "the attached device named",
              vol)
    written = vol.get("server_bytes_written")
    check(written is None or written > 0, "the server wrote the tests' data", vol)
    if node:
        check(run["node"] == node and prov["nodes"]["back-end"] == node, f"the run ran on {node}",
              (run["node"], prov.get("nodes")))
        check("front-end" in vol.get("server", "") or "this front-end" in vol.get("server", ""),
              "the front-end served it", vol)
    g = next(iter(guest))
    b = next((m for m in base if m["test"] == g["test"]), base[0])
    return (f"{scheme} attached by {attach}: {g['test']} guest {g['value']:.1f} {g['metric']}, host domain "
            f"{b['value']:.1f}; {vol.get('initiator') or 'the guest initiator'}"
            + (f"; server wrote {written / 1e6:.1f} MB" if written else ""))


def main(argv: list[str]) -> int:
    try:
        match argv:
            case ["run", run_json, props_json, *fe_tests]:
                print(check_run(Path(run_json), Path(props_json), fe_tests or ["tcp-stream-fe"]))
            case ["nfs-run", run_json]:
                print(check_nfs_run(Path(run_json)))
            case ["iperf3-run", run_json]:
                print(check_iperf3_run(Path(run_json)))
            case ["spread-run", run_json]:
                print(check_spread_run(Path(run_json)))
            case ["mpi-run", run_json]:
                print(check_mpi_run(Path(run_json)))
            case ["fiocs-run", run_json]:
                print(check_fiocs_run(Path(run_json)))
            case ["host-raid", run_json]:
                print(check_host_raid(Path(run_json)))
            case ["volume-run", run_json, scheme, attach, *node]:
                print(check_volume_run(Path(run_json), scheme, attach, *node[:1]))
            case ["node-state", name]:
                print(node_state(json.load(sys.stdin), name))
            case ["wrong-code", code]:
                print(wrong_code(code))
            case ["propagation", props_json]:
                print(propagation(Path(props_json)))
            case ["watch-state", name, db, seconds]:
                watch_state(name, db, float(seconds))
            case ["listeners", allow_md, node]:
                print(listeners(Path(allow_md), node, sys.stdin.read()))
            case ["listeners-run", allow_md, node, private]:
                print(listeners_run(Path(allow_md), node, private, sys.stdin.read()))
            case _:
                print(__doc__, file=sys.stderr)
                return 2
    except CheckFailed as e:
        print(f"cluster check failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

