"""What tests/image/xen.bats checks in a Xen run's JSON (`cloudbox results export --format json`, its last run).
Standard library only: it runs with the test host's python3.

    xen_checks.py run RUN_JSON PROFILE BUS [DRIVER]
                                               the last run: completed under Xen, a PV guest on BUS (its disk's
                                               libxl driver DRIVER: phy for blkback, qemu for qdisk), the same
                                               storage and network tests on both sides, the baseline dom0's, the
                                               guest emulated
    xen_checks.py storage RUN_JSON PROFILE MACHINE BUS
                                               the last run: completed under Xen, a guest of libvirt machine MACHINE
                                               (xenpvh: PVH, xenfv: HVM) whose disk is on BUS, the same storage
                                               tests on both sides, the baseline dom0's, the guest emulated
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


class CheckFailed(Exception):
    """A fact the run should show and does not; the message names it with the value found."""


def check(ok: object, what: str, found: object) -> None:
    if not ok:
        raise CheckFailed(f"{what}; found: {found!r}")


def check_sides(run: dict) -> dict[str, set[str]]:
    """Each side's tests, checked: dom0's baseline not emulated, the guest's emulated and quick-size above 0, the
    same tests on both."""
    sides: dict[str, set[str]] = {}
    for m in run["measurements"]:
        sides.setdefault(m["side"], set()).add(m["test"])
        if m["side"] == "baseline":
            check("dom0" in m["labels"] and "emulated" not in m["labels"], "the baseline is dom0's, not emulated", m)
        elif m["side"] == "guest":
            check("emulated" in m["labels"] and "quick-size" in m["labels"], "a guest number: emulated, quick-size", m)
            check(m["value"] > 0, "a guest number above 0", m)
    check(sides.get("guest") and sides.get("guest") == sides.get("baseline"),
          "the same tests on the guest and dom0", sides)
    return sides


def write_pair(run: dict) -> tuple[dict, dict]:
    """The guest's write measurement and dom0's of the same test."""
    write = next(m for m in run["measurements"] if m["side"] == "guest" and "write" in m["test"])
    return write, next(m for m in run["measurements"] if m["side"] == "baseline" and m["test"] == write["test"])


def check_run(run_json: Path, profile: str, bus: str, driver: str | None = None) -> str:
    run = json.loads(run_json.read_text())["runs"][-1]
    prov = run["provenance"]
    check(run["state"] == "completed", "the run completed", (run["state"], run["reason"]))
    check(run["profile_name"] == profile, f"the run is of profile {profile}", run["profile_name"])
    acc = prov["accelerator"]
    check(acc["name"] == "xen" and acc["domain_type"] == "xen", "the guest ran under Xen", acc)
    check(acc["emulated"] and run["emulated"], "Xen under QEMU TCG: the run is labelled emulated", acc)
    dom = ET.fromstring(prov["domain_xml"])
    os_type = dom.find("os/type")
    # libvirt's live XML names a PV guest's OS type "linux", its older word for "xen"
    check(dom.get("type") == "xen" and os_type is not None and os_type.get("machine") == "xenpv"
          and os_type.text in ("xen", "linux"), "a Xen PV domain (machine xenpv)",
          (dom.get("type"), None if os_type is None else (os_type.get("machine"), os_type.text)))
    target = dom.find("devices/disk/target")
    check(target is not None and target.get("bus") == bus and (target.get("dev") or "").startswith("xvd"),
          f"the benchmark disk on bus {bus} as xvd*", None if target is None else target.attrib)
    drv = dom.find("devices/disk/driver")
    check(driver is None or (drv is not None and drv.get("name") == driver), f"the disk's backend driver {driver}",
          None if drv is None else drv.attrib)
    check(prov.get("guest_kernel"), "the guest's kernel version", prov.get("guest_kernel"))
    sides = check_sides(run)
    check(any("write" in t for t in sides["guest"]) and any(t.startswith("tcp-") for t in sides["guest"]),
          "storage and network tests", sides)
    write, base = write_pair(run)
    tx = next(m for m in run["measurements"] if m["side"] == "guest" and m["test"] == "tcp-stream")
    return (f"{len(run['measurements'])} measurements; {write['test']}: guest {write['value']:.1f} "
            f"{write['metric']}, dom0 {base['value']:.1f}; tcp-stream guest {tx['value']:.0f} {tx['metric']}; "
            f"launch to agent {prov.get('launch_to_agent_s')} s")


def check_storage_run(run_json: Path, profile: str, machine: str, bus: str) -> str:
    run = json.loads(run_json.read_text())["runs"][-1]
    prov = run["provenance"]
    check(run["state"] == "completed", "the run completed", (run["state"], run["reason"]))
    check(run["profile_name"] == profile, f"the run is of profile {profile}", run["profile_name"])
    acc = prov["accelerator"]
    check(acc["name"] == "xen" and acc["domain_type"] == "xen", "the guest ran under Xen", acc)
    check(acc["emulated"] and run["emulated"], "Xen under QEMU TCG: the run is labelled emulated", acc)
    dom = ET.fromstring(prov["domain_xml"])
    os_type = dom.find("os/type")
    check(dom.get("type") == "xen" and os_type is not None and os_type.get("machine") == machine,
          f"a Xen domain of machine {machine}",
          (dom.get("type"), None if os_type is None else (os_type.get("machine"), os_type.text)))
    target = dom.find("devices/disk/target")
    check(target is not None and target.get("bus") == bus, f"the benchmark disk on bus {bus}",
          None if target is None else target.attrib)
    check(prov.get("guest_kernel"), "the guest's kernel version", prov.get("guest_kernel"))
    check_sides(run)
    write, base = write_pair(run)
    return (f"{len(run['measurements'])} measurements; {write['test']}: guest {write['value']:.1f} "
            f"{write['metric']}, dom0 {base['value']:.1f}; launch to agent {prov.get('launch_to_agent_s')} s")


def main(argv: list[str]) -> int:
    try:
        match argv:
            case ["run", run_json, profile, bus, *driver] if len(driver) <= 1:
                print(check_run(Path(run_json), profile, bus, *driver))
            case ["storage", run_json, profile, machine, bus]:
                print(check_storage_run(Path(run_json), profile, machine, bus))
            case _:
                print(__doc__, file=sys.stderr)
                return 2
    except CheckFailed as e:
        print(f"xen check failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
