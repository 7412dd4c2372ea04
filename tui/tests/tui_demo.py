"""Deterministic demo data for the TUI, shared by the snapshot tests (test_tui_snapshots.py) and the
docs screenshot generator (scripts/tui-screenshots): one box, one results history, two guests.

Nothing here reads this host: host facts are fixed dataclasses, every run and event carries a fixed
timestamp (2025-11-14, shown in UTC), guests live in libvirt's test:///default driver, and the state
and preset directories sit at one fixed path (DEMO_ROOT), because the TUI shows file paths (a
profile's file, the export target) and a snapshot must not depend on where the checkout is.

Lives in tui/tests (not in the cloudbox package): it is test data, and the installed package stays
free of it. The screenshot script puts this directory on sys.path.

Use `demo_environment()` around everything (environment, lock, fresh state), `demo_guests()` while a
guests scene runs, `demo_app(scene)` for the app, and `await SCENES[name].drive(pilot)` to bring the
app into a scene's state (data loaded, keys pressed) before taking a screenshot.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import io
import os
import shutil
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, Static

from cloudbox.core.cluster.frontend import CodeOffer
from cloudbox.core.cluster.registry import JoinCode
from cloudbox.core.disks.volumes.attach import Export
from cloudbox.core.disks.volumes.store import VolumeStore
from cloudbox.core.record.events import StateEvent
from cloudbox.core.record.provenance import BackingInfo, Guests, GuestStart, Provenance, Versions
from cloudbox.core.record.results import ResultStore
from cloudbox.core.spec import profiles
from cloudbox.core.spec.runspec import PlanStep
from cloudbox.core.studies.capability import Answers, Capability
from cloudbox.core.views.host import Disk, HostFacts, Nic, Node
from cloudbox.core.views.readiness import DiskReadiness, LinkFacts, Readiness
from cloudbox.core.virt import domain
from cloudbox.core.virt.accel import Accelerator
from cloudbox.core.virt.guestimage import CMDLINE
from cloudbox.tui.app import CloudboxApp, create_app
from cloudbox.tui.backend import Backend

REPO = Path(__file__).resolve().parents[2]
DEMO_ROOT = Path("/tmp/cloudbox-demo")  # fixed: the TUI shows paths under it
LIBVIRT_URI = "test:///default"
SIZE = (100, 32)  # the snapshots' and screenshots' terminal (width, height)
SMALL = (80, 24)

HOST = "cb-front"  # the demo box; runs recorded on it look alive to a ResultStore on any other host
T0 = 1_763_110_800.0  # 2025-11-14 09:00:00 UTC
DAY = 86_400.0

# -- host facts ----------------------------------------------------------------------------------

TCG = Accelerator("tcg", "qemu", emulated=True, nested=False,
                  reason="/dev/kvm is missing: the CPU's virtualization extensions are off in the firmware")
KVM = Accelerator("kvm", "kvm", emulated=False, nested=False,
                  reason="/dev/kvm usable: the guest kernel booted under KVM in 1.4 s", probe_seconds=1.4)
ACCELERATORS = {"tcg": TCG, "kvm": KVM}


def host_facts(accelerator: Accelerator = TCG, role: str = "all-in-one") -> HostFacts:
    """The demo box: an installed all-in-one (or front-end) node with a system SSD, a data disk for runs and two
    NICs."""
    return HostFacts(
        hostname=HOST,
        role=role,
        role_source="/etc/cloudbox/node.toml",
        nodes=[Node(HOST, role, "up", "this box")],
        accelerator=accelerator,
        accelerator_problem=None,
        libvirtd="libvirtd running (pid 812)",
        disks=[
            Disk("nvme0n1", 256_060_514_304, "Samsung SSD 980 256GB", False, "nvme", ["/", "/var"]),
            Disk("sdb", 500_107_862_016, "WDC WD5003ABYX-01WERA0", True, "sata", []),
            Disk("sdc", 1_000_204_886_016, "ST1000NM0033-9ZM173", True, "sata", []),
        ],
        nics=[
            Nic("eno1", "3c:ec:ef:4a:10:2e", 1500, "up", ["192.168.10.11/24"]),
            Nic("eno2", "3c:ec:ef:4a:10:2f", 9000, "up", ["10.10.0.1/24"]),
            Nic("cbbr0", "52:54:00:cb:00:01", 9000, "up", ["10.99.0.1/24"]),
        ],
        problems=[],
    )


def demo_answers(accelerator: Accelerator = TCG) -> Answers:
    """The demo box's readiness report (as `cloudbox host readiness --fio-seconds 0 --link-seconds 0` would give
    it): Secure Boot on, the IOMMU in the firmware but not turned on, a 1 Gb/s private NIC that takes jumbo frames,
    no node enrolled; two spare disks, so no loop device stands in."""
    emulated = accelerator.emulated
    facts = Readiness(
        HOST, "Intel(R) Xeon(R) E-2236 CPU @ 3.40GHz", 12, "" if emulated else "vmx",
        f"{accelerator.label}: {accelerator.reason}",
        "present (DMAR table), not enabled: turn on VT-d/AMD-Vi in the firmware and boot with intel_iommu=on "
        "iommu=pt", False, "on", 32 * 1024**3, 1,
        disks=[DiskReadiness("sdb", "WDC WD5003ABYX-01WERA0", "01.01S03", "-", 500_107_862_016, True, "sata", [],
                             "passed", read_note="not measured (--fio-seconds 0)"),
               DiskReadiness("sdc", "ST1000NM0033-9ZM173", "GA0A", "-", 1_000_204_886_016, True, "sata", [],
                             "passed", read_note="not measured (--fio-seconds 0)")],
        private_link=LinkFacts("eno2", "eno2", "up", 1000, "full", 9000, 9216),
        link_note="no node enrolled: the jumbo-frame ping and iperf3 to another node are skipped",
        problems=["the CPU shows no VT-x (vmx) or AMD-V (svm): turn virtualization on in the firmware, or guests "
                  "run under emulation (TCG) and no figure is an overhead figure"] if emulated else [],
        emulated=emulated, nested=accelerator.nested)
    node = ("needs a back-end enrolled on the private network (a second machine) for the tests towards another "
            "node: tcp-stream-fe, tcp-maerts-fe (14 cells)")
    xen = "not here (Xen profile: boot the appliance's Xen entry): xen-default"
    studies = [Capability("a", "Study A", size, 54, 28, [node, xen + ", xen-xvd-phy"]) for size in ("study", "quick")]
    studies += [Capability("b", "Study B", size, 21, 14, [xen]) for size in ("study", "quick")]
    studies += [Capability(s, f"Study {s}", size, n, n) for s, n in (("c", 42), ("c-nfs", 9))
                for size in ("study", "quick")]
    studies += [Capability("d", "Study D", size, 2, 2) for size in ("study", "quick")]
    return Answers(facts, studies)


# -- environment -----------------------------------------------------------------------------------


@contextlib.contextmanager
def demo_environment(root: Path = DEMO_ROOT) -> Iterator[Path]:
    """Fresh demo state at `root` (held under a lock: one user at a time), TZ=UTC, presets from the
    checkout's profiles/ seen at root/profiles, the working directory root/home (export's default).
    Restores the environment, time zone and directory afterwards."""
    if socket.gethostname() == HOST:
        raise RuntimeError(f"this host is called {HOST}, like the demo box: its demo runs would be checked "
                           "against local processes")
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(root, ignore_errors=True)
        (root / "home").mkdir(parents=True)
        (root / "run").mkdir()
        (root / "profiles").symlink_to(REPO / "profiles")
        env = {
            "CLOUDBOX_STATE_DIR": str(root / "state"),
            "CLOUDBOX_RUN_DIR": str(root / "run"),
            "CLOUDBOX_PRESET_DIR": str(root / "profiles"),
            "CLOUDBOX_PROFILE_PATH": None,
            "CLOUDBOX_ACCEL": None,
            "HOME": str(root / "home"),
            "TZ": "UTC",
            "NO_COLOR": None,
        }
        saved = {k: os.environ.get(k) for k in env}
        cwd = os.getcwd()
        try:
            for k, v in env.items():
                _setenv(k, v)
            time.tzset()
            os.chdir(root / "home")
            yield root
        finally:
            os.chdir(cwd)
            for k, v in saved.items():
                _setenv(k, v)
            time.tzset()
            shutil.rmtree(root, ignore_errors=True)


def _setenv(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


# -- results -----------------------------------------------------------------------------------------

# Host disk metrics (avgrq sectors, avgqu, util %) per test and side, and the MB/s measured.
# Bare metal is the WD RE4 of Study A (sdb); the guest numbers are what such a disk gives each profile.
_BARE = {
    "dd-write-64k": (112.0, 128, 0.98, 97), "dd-read-64k": (110.0, 128, 0.97, 96),
    "seq-write-64k": (113.0, 1024, 3.6, 100), "seq-read-64k": (111.0, 256, 1.9, 99),
}
STUDY_TESTS = ("dd-write-64k", "dd-read-64k", "seq-write-64k", "seq-read-64k")


@dataclass
class DemoRun:
    profile: str
    suite: str  # storage | network | all | guest
    size: str  # quick | study
    accelerator: str
    started_at: float
    guest: dict[str, tuple[float, float, float, float]]  # test -> (MB/s, avgrq, avgqu, util)
    net: dict[str, tuple[float, float, str]]  # test -> (guest, baseline, metric)
    state: str = "completed"
    reason: str | None = None
    seconds: float = 0.0  # 0: derived from the tests
    events: bool = False  # record the live event stream (the tests screen's view of the run)
    uuid: str | None = None


RUNS: list[DemoRun] = [
    DemoRun("eucalyptus-default", "all", "study", "kvm", T0 - 6 * DAY,
            {"dd-write-64k": (1.3, 30, 0.9, 90), "dd-read-64k": (71.9, 256, 0.6, 66),
             "seq-write-64k": (1.4, 30, 0.9, 91), "seq-read-64k": (72.4, 256, 0.6, 67)},
            {"tcp-stream": (667.4, 940.0, "Mbit/s"), "tcp-maerts": (423.0, 940.0, "Mbit/s"),
             "tcp-rr": (4900.0, 9800.0, "trans/s")}),
    DemoRun("virtio-disk", "storage", "study", "kvm", T0 - 5 * DAY,
            {"dd-write-64k": (108.0, 128, 0.95, 95), "dd-read-64k": (76.2, 256, 0.62, 70),
             "seq-write-64k": (110.0, 1024, 3.1, 99), "seq-read-64k": (77.0, 256, 0.64, 71)}, {}),
    DemoRun("kvm-scsi-phy", "storage", "study", "kvm", T0 - 4 * DAY,
            {"dd-write-64k": (70.2, 128, 0.7, 74), "dd-read-64k": (70.9, 128, 0.69, 72),
             "seq-write-64k": (71.5, 128, 0.72, 75), "seq-read-64k": (70.3, 128, 0.7, 72)}, {}),
    DemoRun("modern-tuned", "all", "quick", "nested-kvm", T0 - 2 * DAY,
            {"dd-write-64k": (96.4, 128, 0.92, 90), "dd-read-64k": (101.0, 256, 1.2, 93),
             "seq-write-64k": (109.0, 1024, 3.4, 99), "seq-read-64k": (108.2, 512, 1.8, 98)},
            {"tcp-stream": (8710.0, 9400.0, "Mbit/s"), "tcp-maerts": (8120.0, 9400.0, "Mbit/s"),
             "tcp-rr": (21400.0, 31800.0, "trans/s")}),
    DemoRun("kvm-ebs-aoe", "storage", "study", "kvm", T0 - DAY, {"dd-write-64k": (18.7, 64, 0.35, 41)}, {},
            state="aborted", reason="cancelled by SIGTERM", seconds=412.0),
    DemoRun("virtio-disk", "storage", "quick", "tcg", T0,
            {"dd-write-64k": (21.4, 128, 0.31, 29), "dd-read-64k": (48.2, 256, 0.62, 58),
             "seq-write-64k": (26.9, 256, 0.45, 33), "seq-read-64k": (52.7, 512, 0.9, 71)}, {},
            events=True),
]
LIVE_RUN = 6  # the run the tests screen is attached to (its events are recorded)
COMPARE_RUNS = (1, 2, 4)  # marked on the results screen

# The guest session (suite "guest") running when the guests scene is shown, and an orphan guest.
SESSION = DemoRun("virtio-disk", "guest", "quick", "tcg", T0 + 3600, {}, {}, state="running",
                  uuid="5f0c2b8e1d3a4c6f8e2b7a9d0c1e2f34")
ORPHAN_UUID = "9a7d1c3342e84b0f9c55e0d1a2b3c4d5"

_JITTER = (0.93, 1.04, 0.98, 1.02, 1.01)  # per-second variation of the live throughput


def _domain_xml(profile: profiles.Profile, run_uuid: str, domain_type: str) -> str:
    return domain.render_domain(domain.DomainPlan(
        profile, name=f"cloudbox-{profile.name}-{run_uuid[:8]}", domain_type=domain_type,
        kernel="/var/cache/cloudbox/guest/vmlinuz", initrd="/var/cache/cloudbox/guest/initrd.img",
        cmdline=CMDLINE, disk_path="/dev/sdb" if profile.disk.backing in ("block-device", "network-volume")
        else f"/var/lib/cloudbox/work/run-{run_uuid[:12]}/disk.img",
        disk_is_block=profile.disk.backing in ("block-device", "network-volume"),
        bridge="cbbr0", mac="52:54:00:" + ":".join(run_uuid[i:i + 2] for i in (0, 2, 4)),
        uuid=f"{run_uuid[:8]}-{run_uuid[8:12]}-{run_uuid[12:16]}-{run_uuid[16:20]}-{run_uuid[20:32]}",
        run_uuid=run_uuid))


def _provenance(d: DemoRun, prof: profiles.Profile, run_uuid: str) -> Provenance:
    domain_type = {"kvm": "kvm", "nested-kvm": "kvm", "tcg": "qemu"}[d.accelerator]
    return Provenance(
        host=HOST, host_kernel="6.12.48+deb13-amd64", cpu="Intel(R) Xeon(R) CPU E5-2620 v3 @ 2.40GHz",
        versions=Versions(cloudbox="0.1.0", qemu="QEMU emulator version 10.0.2", libvirt="11.3.0", fio="fio-3.39",
                          netperf="Netperf version 2.7.1", iperf3="iperf 3.18"),
        backing=BackingInfo(kind=prof.disk.backing, device="sdb", model="WDC WD5003ABYX-01WERA0", path="/dev/sdb",
                            size_bytes=500_107_862_016),
        domain_xml=_domain_xml(prof, run_uuid, domain_type))


def _storage_test(store: ResultStore, rid: int, d: DemoRun, side: str, test: str, t: float, events: bool) -> float:
    """One test: its step, once-a-second progress and host samples, and the measurement. Returns the end."""
    mbps, rq, qu, util = _BARE[test] if side == "baseline" else d.guest[test]
    labels = ["quick-size"] if d.size == "quick" else []
    if side == "guest" and d.accelerator in ("tcg", "nested-kvm"):
        labels.append("emulated")
    if events:
        store.add_event(rid, "step", {"text": f"{side}: {test}", "side": side, "test": test}, t=t)
        for i, j in enumerate(_JITTER, start=1):
            row = {"t": t + i, "device": "sdb", "test": f"{side}:{test}", "read_mbps": mbps * j if "read" in test
                   else 0.0, "write_mbps": 0.0 if "read" in test else mbps * j, "avgrq_sectors": rq * (2 - j),
                   "avgqu": round(qu * j, 2), "util": min(100.0, util * j)}
            store.add_samples(rid, [row])
            store.add_event(rid, "sample", row, t=t + i)
            store.add_event(rid, "progress", {"side": side, "test": test, "pct": 20.0 * i,
                                              "mbps": round(mbps * j, 2), "eta": f"00m:{5 - i:02d}s"}, t=t + i + 0.1)
    end = t + len(_JITTER) + 0.5
    store.add_measurement(rid, side=side, test=test, metric="MB/s", value=mbps, host_mbps=mbps,
                          host_avgrq_sectors=rq, host_avgqu=qu, host_util=util, labels=labels,
                          started_at=t, finished_at=end)
    if events:
        store.add_event(rid, "measurement", {"side": side, "test": test, "metric": "MB/s", "value": mbps,
                                             "host_mbps": mbps, "host_avgrq_sectors": rq, "host_avgqu": qu,
                                             "host_util": util, "labels": labels}, t=end)
    return end + 0.5


def add_run(store: ResultStore, d: DemoRun) -> int:
    """Record `d` as the executor would have: the run row, measurements and (if asked) its event stream."""
    prof = profiles.find_profile(d.profile)
    run_uuid = d.uuid or (f"{int(d.started_at):08x}" + prof.hash[:24])
    rid = store.create_run(profile_name=prof.name, profile_hash=prof.hash, profile_toml=prof.to_toml(),
                           suite=d.suite, size_bytes=128 * 2**20 if d.size == "quick" else 2 * 2**30,
                           size_label=d.size, accelerator=d.accelerator, node=HOST, pid=4242,
                           started_at=d.started_at, uuid=run_uuid, provenance=_provenance(d, prof, run_uuid))
    t = d.started_at + 0.2
    ev = d.events
    storage_tests = [x for x in STUDY_TESTS if x in d.guest] if d.suite in ("storage", "all") else []
    acc_label = {"kvm": "KVM", "nested-kvm": "KVM (nested)", "tcg": "TCG (emulated)"}[d.accelerator]
    if ev:
        plan = ([PlanStep("baseline", x) for x in storage_tests] + [PlanStep("guest", "boot")]
                + [PlanStep("guest", x) for x in storage_tests])
        store.add_event(rid, "state", StateEvent("running", profile=prof.name, suite=d.suite,
                                                 plan=tuple(plan)).to_payload(), t=t)
        for i, text in enumerate(("checking the benchmark guest image", "probing the accelerator")):
            store.add_event(rid, "step", {"text": text}, t=t + 0.1 * (i + 1))
        store.add_event(rid, "log", {"text": f"accelerator: {acc_label}: {TCG.reason}"}, t=t + 2.4)
        store.add_event(rid, "step", {"text": "connecting to libvirt"}, t=t + 2.5)
        store.add_event(rid, "step", {"text": "preparing the backing store (block-device, 128 MiB)"}, t=t + 2.7)
        store.add_event(rid, "step", {"text": "bare metal: storage tests", "side": "baseline"}, t=t + 3.0)
        t += 3.1
    for test in storage_tests:
        t = _storage_test(store, rid, d, "baseline", test, t, ev)
    if ev:
        name = f"cloudbox-{prof.name}-{run_uuid[:8]}"
        store.add_event(rid, "step", {"text": f"launching guest {name} ({acc_label})"}, t=t)
        for s in range(0, 21, 4):
            store.add_event(rid, "progress", {"side": "guest", "test": "boot", "pct": 0, "eta": f"{s}s"}, t=t + s)
        store.add_event(rid, "log", {"text": "guest agent ready after 21.4 s"}, t=t + 21.4)
        store.add_event(rid, "progress", {"side": "guest", "test": "boot", "pct": 100}, t=t + 22.0)
        store.add_event(rid, "log", {"text": f"guest benchmark disk: /dev/vda (bus {prof.disk.bus})"}, t=t + 22.3)
        store.add_event(rid, "step", {"text": "guest: storage tests", "side": "guest"}, t=t + 22.5)
        t += 23.0
    else:
        t += 22.0
    for test in storage_tests:
        t = _storage_test(store, rid, d, "guest", test, t, ev)
    for test, (guest, bare, metric) in d.net.items():
        for side, value in (("guest", guest), ("baseline", bare)):
            labels = ["emulated"] if side == "guest" and d.accelerator in ("tcg", "nested-kvm") else []
            store.add_measurement(rid, side=side, test=test, metric=metric, value=value, labels=labels,
                                  started_at=t, finished_at=t + 30)
            t += 31
    if ev:
        store.add_event(rid, "step", {"text": "cleaning up"}, t=t)
    if d.state != "running":
        store.finish_run(rid, d.state, d.reason, finished_at=d.started_at + d.seconds if d.seconds else t + 1.5)
    return rid


# A run of two TCG guests at once (the tests-live-guests scene): per test, bare metal's (p1, p2) and each guest's
# MB/s (g1, g2); the run's figure is their sum.
GUESTS_RUN = {"seq-write-64k": ((180.0, 171.0), (26.1, 29.5)), "seq-read-64k": ((560.0, 556.6), (80.4, 113.2))}


def add_guests_run(store: ResultStore) -> int:
    """Record a completed run of two guests with its event stream: each instance's progress and figure, their sum."""
    prof = profiles.find_profile("virtio-disk")
    run_uuid = f"{int(T0 + 7200):08x}" + prof.hash[:24]
    tests = list(GUESTS_RUN)
    prov = _provenance(DemoRun("virtio-disk", "storage", "quick", "tcg", T0 + 7200, {}, {}), prof, run_uuid)
    prov.guests = Guests(count=2, guests=[GuestStart(name=f"cloudbox-virtio-disk-{run_uuid[:8]}-g{k}")
                                          for k in (1, 2)], skew_s={"seq-write-64k": 0.002, "seq-read-64k": 0.012})
    rid = store.create_run(profile_name=prof.name, profile_hash=prof.hash, profile_toml=prof.to_toml(),
                           suite="storage", size_bytes=128 * 2**20, size_label="quick", accelerator="tcg", node=HOST,
                           pid=4242, started_at=T0 + 7200, uuid=run_uuid, provenance=prov)
    t = T0 + 7200.2
    plan = ([PlanStep("baseline", x) for x in tests] + [PlanStep("guest", "boot")]
            + [PlanStep("guest", x) for x in tests])
    store.add_event(rid, "state", StateEvent("running", profile=prof.name, suite="storage",
                                             plan=tuple(plan)).to_payload(), t=t)
    store.add_event(rid, "step", {"text": "preparing 2 backing stores (block-device, 128 MiB each)"}, t=t + 1)
    t += 2
    for side in ("baseline", "guest"):
        if side == "guest":
            store.add_event(rid, "step", {"text": "launching 2 guests (TCG (emulated))"}, t=t)
            store.add_event(rid, "progress", {"side": "guest", "test": "boot", "pct": 100}, t=t + 20)
            t += 21
        for test, figures in GUESTS_RUN.items():
            each = figures[0] if side == "baseline" else figures[1]
            labels = ["quick-size"] + (["emulated"] if side == "guest" else [])
            store.add_event(rid, "step", {"text": f"{side}: {test} (2 at once)", "side": side, "test": test}, t=t)
            for i, j in enumerate(_JITTER, start=1):
                for k, v in enumerate(each, start=1):
                    store.add_event(rid, "progress", {"side": side, "test": test, "pct": 20.0 * i,
                                                      "mbps": round(v * j * (1.1 if k == 2 else 1.0), 2),
                                                      "instance": k}, t=t + i + 0.1 * k)
            end = t + len(_JITTER) + 0.5
            for k, v in enumerate(each, start=1):
                store.add_measurement(rid, side=side, test=test, metric="MB/s", value=v, labels=labels,
                                      started_at=t, finished_at=end, instance=k)
                store.add_event(rid, "measurement", {"side": side, "test": test, "metric": "MB/s", "value": v,
                                                     "labels": labels, "instance": k}, t=end)
            total = round(sum(each), 2)
            store.add_measurement(rid, side=side, test=test, metric="MB/s", value=total, labels=labels,
                                  started_at=t, finished_at=end, host_mbps=total, host_avgrq_sectors=256,
                                  host_avgqu=0.9, host_util=70)
            store.add_event(rid, "measurement", {"side": side, "test": test, "metric": "MB/s", "value": total,
                                                 "labels": labels, "host_mbps": total, "host_avgrq_sectors": 256,
                                                 "host_avgqu": 0.9, "host_util": 70}, t=end)
            t = end + 0.5
    store.add_event(rid, "step", {"text": "cleaning up"}, t=t)
    store.finish_run(rid, "completed", None, finished_at=t + 1.5)
    return rid


def build_results(store: ResultStore, *, guest_session: bool = False) -> list[int]:
    """The results history (RUNS, ids 1..6 in that order); with guest_session also the running guest
    session SESSION (id 7) that the guests scene shows."""
    ids = [add_run(store, d) for d in RUNS]
    if guest_session:
        ids.append(add_run(store, SESSION))
    return ids


# -- guests (libvirt's test driver) ------------------------------------------------------------------------


@contextlib.contextmanager
def demo_guests(uri: str = LIBVIRT_URI) -> Iterator[list[str]]:
    """Start the demo guests in libvirt's test driver: the running guest session (SESSION) and an orphan
    whose run is gone. test:///default keeps its state only while a connection to it is open, and every
    connection in the process then shares it: this one stays open until the block ends (the backend's
    own connections see the guests), and the block starts from the driver's pristine state."""
    import libvirt

    libvirt.registerErrorHandler(lambda *_: None, None)
    conn = libvirt.open(uri)
    try:
        existing = sorted(d.name() for d in conn.listAllDomains(0))
        if existing != ["test"]:
            raise RuntimeError(f"{uri} is not pristine (domains {existing}): another connection is still open")
        names = []
        for prof_name, run_uuid in ((SESSION.profile, SESSION.uuid or ""), ("modern-tuned", ORPHAN_UUID)):
            xml = _domain_xml(profiles.find_profile(prof_name), run_uuid, "kvm").replace(
                '<domain type="kvm">', '<domain type="test">', 1)
            dom = conn.createXML(xml, 0)
            names.append(dom.name())
        yield names
    finally:
        for dom in conn.listAllDomains(0):
            if dom.name() != "test" and dom.isActive():
                dom.destroy()
        conn.close()


# -- the cluster (a front-end's node registry) ------------------------------------------------------------


def _demo_key(seed: int) -> str:
    """A fixed, well-formed ed25519 public key line (never used to connect)."""
    kind = b"ssh-ed25519"
    blob = len(kind).to_bytes(4, "big") + kind + (32).to_bytes(4, "big") + bytes([seed]) * 32
    return f"ssh-ed25519 {base64.b64encode(blob).decode()}"


# name, address, state, reason, last seen (None: never checked)
DEMO_NODES = [
    ("cb-node1", "10.10.0.12", "up", "libvirt 11.3.0 on cb-node1", T0 + 600),
    ("cb-node2", "10.10.0.13", "down", "libvirt at 10.10.0.13: Cannot recv data: Connection reset by peer; ssh: "
     "Host key verification failed.", T0 - 3 * 3600),
    ("cb-node3", "10.10.0.14", "unknown", None, None),
]
DEMO_CODE = "7K3M-Q9XD-2PWN-HT4R"  # what the join-code scene shows (the dialog is given it; nothing is enrolled)


def build_cluster() -> None:
    """The front-end's registry: DEMO_NODES enrolled with spent codes, their last check just now (so the
    overview shows the stored state, not 'unknown'), last seen at fixed times."""
    from cloudbox.core.cluster.registry import Registry

    with Registry() as reg:
        for i, (name, address, state, reason, _seen) in enumerate(DEMO_NODES):
            _, rec = reg.make_code()
            reg.enrol(name=name, role="back-end", address=address, ssh_port=22, host_key=_demo_key(i + 1),
                      client_key=_demo_key(i + 101), code_key=rec.key, peer=address)
            if state != "unknown":
                reg.set_health(name, state, reason)
        with reg._write() as conn:
            for name, _a, _s, _r, last_seen in DEMO_NODES:
                conn.execute("UPDATE nodes SET last_seen = ? WHERE name = ?", (last_seen, name))


# -- volumes ---------------------------------------------------------------------------------------------------

# The run exporting volume ebs while the volumes scene is shown (id 7 after RUNS), and how the demo box exports.
EBS_RUN = DemoRun("kvm-ebs-nbd", "storage", "quick", "tcg", T0 + 1800, {}, {}, state="running",
                  uuid="c0ffee0d1a2b4c3d8e9f00aa11bb22cc")
DEMO_EXPORTS = [Export("nbd", "qemu-nbd", ("guest", "qemu")), Export("aoe", "vblade", ("guest",)),
                Export("iscsi", "tgtd", ("qemu",))]
DEMO_VOLUMES = [("ebs", 64 * 2**20, T0 - 3 * DAY), ("scratch", 4 * 2**20, T0 - DAY + 600)]  # name, size, created


def build_volumes(store: ResultStore) -> None:
    """Real pre-allocated volumes (small files) in the demo state, made at fixed times, ebs attached by EBS_RUN
    (kept live by this process's pid)."""
    add_run(store, EBS_RUN)
    with VolumeStore() as vs:
        for name, size, _t in DEMO_VOLUMES:
            vs.create(name, size)
        with vs._write() as conn:
            for name, _s, created in DEMO_VOLUMES:
                conn.execute("UPDATE volumes SET created = ? WHERE name = ?", (created, name))
        vs.attach("ebs", EBS_RUN.uuid or "", os.getpid())


def demo_offer() -> CodeOffer:
    rec = JoinCode(id=4, key=b"", created_at=T0, expires_at=T0 + 900, used_at=None, used_by=None,
                   revoked_at=None, revoked_reason=None)
    return CodeOffer(DEMO_CODE, rec, 15, "10.10.0.1", 7413, "started", 2417)


# -- the app and its scenes ------------------------------------------------------------------------------


def demo_app(scene: str) -> CloudboxApp:
    """The app for a scene: fixed host facts, the demo results store, guests from the test driver;
    periodic reloads are effectively off (the data does not change while a scene is shown)."""
    s = SCENES[scene]
    store = ResultStore()
    try:
        if not store.run_ids():
            build_results(store, guest_session=s.guests)
            if s.volumes:
                build_volumes(store)
    finally:
        store.close()
    if s.role == "front-end":
        build_cluster()
    backend = Backend(facts=host_facts(ACCELERATORS[s.accelerator], s.role), libvirt_uri=LIBVIRT_URI,
                      exports=DEMO_EXPORTS, answers=demo_answers(ACCELERATORS[s.accelerator]))
    return create_app(backend, mode=s.mode, poll_interval=3600.0)


async def settle(pilot: Pilot, ready: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    """Let the app work (background loads, their callbacks, refreshes) until `ready()`; fail after
    `timeout` seconds saying `what` never appeared."""
    start = time.monotonic()
    deadline, reloaded = start + timeout, False
    while True:
        await pilot.pause(0.05)
        busy = [w.name for w in pilot.app.workers
                if w.state.name in ("PENDING", "RUNNING") and w.group.startswith("load-")]
        problem = ""
        try:
            ok = ready()
        except Exception as e:  # noqa: BLE001 - the widget is not there yet
            ok, problem = False, f"{type(e).__name__}: {e}"
        if ok and not busy:
            for field in pilot.app.screen.query(Input):
                field.cursor_blink = False  # a blinking cursor is on or off depending on the moment of the shot
            await pilot.pause()
            await pilot.wait_for_scheduled_animations()
            return
        if not ok and not busy and not reloaded and time.monotonic() > start + timeout / 3:
            # The app shows new data on its next periodic reload, which the demo puts an hour away (its data
            # does not change); one reload stands for it when a first load came back without the data.
            reloaded = True
            print(f"settle: no {what} after {timeout / 3:.0f} s ({problem or 'not ready'}); reloading "
                  f"{pilot.app.screen!r} once", file=sys.stderr)
            reload = getattr(pilot.app.screen, "reload", None)
            if reload is not None:
                reload()
        if time.monotonic() > deadline:
            raise AssertionError(f"the TUI did not show {what} within {timeout:.0f} s (ready: {ok} {problem}; "
                                 f"loads still running: {busy or 'none'}; reloaded once: {reloaded}; errors "
                                 f"shown: {pilot.app.errors or 'none'}; screen {pilot.app.screen!r})")


def _rows(app: CloudboxApp, selector: str) -> int:
    return app.screen.query_one(selector, DataTable).row_count


def _text(app: CloudboxApp, selector: str) -> str:
    """A Static's content as plain text (strings, Rich Text, tables and groups alike)."""
    content = app.screen.query_one(selector, Static).content
    if isinstance(content, str):
        return content
    console = Console(width=200, record=True, file=io.StringIO(), color_system=None)
    console.print(content)
    return console.export_text()


async def overview(pilot: Pilot) -> None:
    app = pilot.app
    await settle(pilot, lambda: _rows(app, "#disks") == 3 and _rows(app, "#nics") == 3
                 and ("Accelerator" in _text(app, "#accel-banner") or "WARNING" in _text(app, "#accel-banner"))
                 and "Secure Boot" in _text(app, "#readiness"), "the host facts and the readiness report")


async def overview_readiness(pilot: Pilot) -> None:
    app = pilot.app
    await overview(pilot)
    app.screen.query_one("#readiness-head").scroll_visible(top=True, animate=False)
    await settle(pilot, lambda: app.screen.query_one("#overview").scroll_y > 0, "the readiness report in view")


async def profiles_detail(pilot: Pilot) -> None:
    app = pilot.app
    await settle(pilot, lambda: _rows(app, "#profiles") >= 11, "the profile list")
    table = app.screen.query_one("#profiles", DataTable)
    table.move_cursor(row=table.get_row_index("modern-tuned"))
    await settle(pilot, lambda: "modern-tuned (preset)" in _text(app, "#profile-detail"), "modern-tuned's knobs")


async def profiles_diff(pilot: Pilot) -> None:
    app = pilot.app
    await settle(pilot, lambda: _rows(app, "#profiles") >= 11, "the profile list")
    table = app.screen.query_one("#profiles", DataTable)
    for name in ("eucalyptus-default", "modern-tuned"):
        table.move_cursor(row=table.get_row_index(name))
        await pilot.press("space")
    await pilot.press("d")
    # side by side ("A  vs  B") where the pane is wide enough, else each differing knob's two values one above the
    # other ("A: ...", "B: ..."): a list of presets longer than the screen takes a scrollbar's width from the pane
    await settle(pilot, lambda: "knobs differ" in _text(app, "#profile-detail"), "the diff of the marked profiles")


async def profile_form_errors(pilot: Pilot) -> None:
    app = pilot.app
    await settle(pilot, lambda: _rows(app, "#profiles") >= 11, "the profile list")
    table = app.screen.query_one("#profiles", DataTable)
    table.move_cursor(row=table.get_row_index("virtio-disk"))
    await pilot.press("n")
    await settle(pilot, lambda: app.screen.query_one("#f-name", Input).value == "virtio-disk-2", "the form")
    app.screen.query_one("#f-name", Input).value = "Virtio Disk!"
    app.screen.query_one("#f-description", Input).value = ""
    await pilot.press("ctrl+s")
    await settle(pilot, lambda: "not saved" in _text(app, "#form-error")
                 and _text(app, "#e-description").startswith("!"), "the field errors")


async def guests(pilot: Pilot) -> None:
    app = pilot.app
    await settle(pilot, lambda: _rows(app, "#guests") == 2 and "2 guests" in _text(app, "#guests-status"),
                 "the two guests")


async def guest_xml(pilot: Pilot) -> None:
    await guests(pilot)
    await pilot.press("x")
    await settle(pilot, lambda: "domain XML" in _text(pilot.app, ".dialog-title"),
                 "the domain XML dialog")


async def guest_stop_confirm(pilot: Pilot) -> None:
    await guests(pilot)
    await pilot.press("s")
    await settle(pilot, lambda: "Stop guest" in _text(pilot.app, ".dialog-title"),
                 "the confirmation")


async def tests_setup(pilot: Pilot) -> None:
    app = pilot.app
    await settle(pilot, lambda: "No run in progress" in _text(app, "#setup-note"), "the setup tab")


async def tests_live(pilot: Pilot) -> None:
    app = pilot.app
    await tests_setup(pilot)
    app.screen.action_attach(LIVE_RUN)  # type: ignore[attr-defined]
    await settle(pilot, lambda: "COMPLETED" in _text(app, "#run-head")
                 and app.screen.query_one("#run-progress").percentage == 1.0, "the finished run", timeout=20)
    app.clear_notifications()
    await settle(pilot, lambda: True, "the charts")


async def tests_live_guests(pilot: Pilot) -> None:
    app = pilot.app
    await tests_setup(pilot)
    with ResultStore() as store:
        rid = add_guests_run(store)
    app.screen.action_attach(rid)  # type: ignore[attr-defined]
    await settle(pilot, lambda: "COMPLETED" in _text(app, "#run-head") and "seq-read-64k done" in _text(
        app, "#run-guests"), "the finished run of two guests", timeout=20)
    app.clear_notifications()
    await settle(pilot, lambda: True, "the charts")


async def results(pilot: Pilot) -> None:
    app = pilot.app
    await settle(pilot, lambda: _rows(app, "#runs") == len(RUNS), "the runs")


async def results_marked(pilot: Pilot) -> None:
    app = pilot.app
    await results(pilot)
    table = app.screen.query_one("#runs", DataTable)
    for rid in COMPARE_RUNS:
        table.move_cursor(row=table.get_row_index(str(rid)))
        await pilot.press("space")
    table.move_cursor(row=0)
    await settle(pilot, lambda: app.screen.marked == list(COMPARE_RUNS), "the marks")  # type: ignore[attr-defined]


async def results_compare(pilot: Pilot) -> None:
    app = pilot.app
    await results_marked(pilot)
    await pilot.press("c")
    await settle(pilot, lambda: app.screen.query_one("#compare-box").has_class("open"), "the comparison table")


async def results_export(pilot: Pilot) -> None:
    await results_marked(pilot)
    await pilot.press("e")
    await settle(pilot, lambda: pilot.app.screen.query_one("#path", Input).value.endswith(".md"),
                 "the export dialog")


async def nodes(pilot: Pilot) -> None:
    app = pilot.app
    await overview(pilot)
    await settle(pilot, lambda: _rows(app, "#nodes") == 1 + len(DEMO_NODES), "the enrolled nodes")
    table = app.screen.query_one("#nodes", DataTable)
    table.focus()
    table.move_cursor(row=2)  # cb-node2, down: its whole reason shows under the table
    await settle(pilot, lambda: "cb-node2: DOWN" in _text(app, "#node-detail"), "the highlighted node's reason")


async def join_code(pilot: Pilot) -> None:
    from cloudbox.tui.screens.join_code import JoinCodeDialog

    await nodes(pilot)
    pilot.app.push_screen(JoinCodeDialog(demo_offer()))
    await settle(pilot, lambda: "7 K 3 M" in _text(pilot.app, "#code"), "the join code dialog")


async def help_screen(pilot: Pilot) -> None:
    await overview(pilot)
    await pilot.press("question_mark")
    await settle(pilot, lambda: pilot.app.screen.query_one("#help-text") is not None, "the help")


async def studies(pilot: Pilot) -> None:
    app = pilot.app
    await settle(pilot, lambda: _rows(app, "#studies") == 6 and _rows(app, "#cells") > 0
                 and "cells done" in _text(app, "#study-head"), "the studies and study A's cells")


async def volumes(pilot: Pilot) -> None:
    app = pilot.app
    await settle(pilot, lambda: _rows(app, "#volumes") == len(DEMO_VOLUMES)
                 and "run 7 kvm-ebs-nbd" in _text(app, "#volume-detail"), "the volumes, ebs attached by run 7")


async def volume_form_errors(pilot: Pilot) -> None:
    app = pilot.app
    await volumes(pilot)
    await pilot.press("n")
    await settle(pilot, lambda: app.screen.query_one("#v-name", Input).has_focus, "the new-volume form")
    app.screen.query_one("#v-name", Input).value = "EBS 2"
    app.screen.query_one("#v-size", Input).value = "1.5G"
    await pilot.press("enter")
    await settle(pilot, lambda: "not understood" in str(app.screen.query_one("#e-size", Static).render()),
                 "the field errors")


@dataclass(frozen=True)
class Scene:
    mode: str
    drive: Callable[[Pilot], Awaitable[None]]
    accelerator: str = "tcg"  # key of ACCELERATORS
    guests: bool = False  # the guest session run and libvirt test-driver guests
    role: str = "all-in-one"  # front-end: with the enrolled DEMO_NODES in the registry
    volumes: bool = False  # DEMO_VOLUMES in the volume registry, ebs attached by the running EBS_RUN


SCENES: dict[str, Scene] = {
    "overview": Scene("overview", overview),
    "overview-kvm": Scene("overview", overview, accelerator="kvm"),
    "readiness": Scene("overview", overview_readiness, accelerator="kvm"),
    "profiles": Scene("profiles", profiles_detail),
    "profile-diff": Scene("profiles", profiles_diff),
    "profile-form": Scene("profiles", profile_form_errors),
    "guests": Scene("guests", guests, guests=True),
    "guest-xml": Scene("guests", guest_xml, guests=True),
    "guest-stop": Scene("guests", guest_stop_confirm, guests=True),
    "tests-setup": Scene("tests", tests_setup),
    "tests-live": Scene("tests", tests_live),
    "tests-live-guests": Scene("tests", tests_live_guests),
    "results": Scene("results", results_marked),
    "results-compare": Scene("results", results_compare),
    "results-export": Scene("results", results_export),
    "nodes": Scene("overview", nodes, accelerator="kvm", role="front-end"),
    "join-code": Scene("overview", join_code, accelerator="kvm", role="front-end"),
    "help": Scene("overview", help_screen),
    "studies": Scene("studies", studies),
    "volumes": Scene("volumes", volumes, volumes=True),
    "volume-form": Scene("volumes", volume_form_errors, volumes=True),
}
