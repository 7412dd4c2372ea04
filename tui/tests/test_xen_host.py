"""A host booted into Xen: how cloudbox knows (dom0's capabilities), what its guests' figures are labelled (Xen itself
in a virtual machine is emulated), and which profiles each boot refuses, naming the boot entry that runs them."""

from __future__ import annotations

import contextlib
import socket
import tempfile
import types
from pathlib import Path

import pytest

from cloudbox.core.run import launch
from cloudbox.core.run.context import host_labels
from cloudbox.core.virt import accel


def _file(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_dom0_is_told_by_control_d(tmp_path):
    assert accel.booted_into_xen(_file(tmp_path / "dom0", "control_d\n"))
    assert not accel.booted_into_xen(_file(tmp_path / "domU", "\n"))  # a Xen guest, not its host
    assert not accel.booted_into_xen(tmp_path / "absent")  # no /proc/xen: plain Linux


@pytest.mark.parametrize(
    ("vendor", "product", "vm"),
    [
        ("QEMU", "Standard PC (Q35 + ICH9, 2009)", "QEMU Standard PC (Q35 + ICH9, 2009)"),
        ("innotek GmbH", "VirtualBox", "innotek GmbH VirtualBox"),
        ("Dell Inc.", "PowerEdge R640", None),
        ("", "", None),
    ],
)
def test_xen_in_a_virtual_machine_is_labelled_emulated(tmp_path, vendor, product, vm):
    _file(tmp_path / "sys_vendor", vendor + "\n")
    _file(tmp_path / "product_name", product + "\n")
    assert accel.dmi_virtual_machine(tmp_path) == vm
    acc = accel.xen_accelerator(tmp_path)
    assert (acc.name, acc.domain_type) == ("xen", "xen")
    assert acc.emulated is acc.nested is (vm is not None)
    assert acc.label == ("Xen (in a VM, emulated)" if vm else "Xen")
    assert not acc.kvm_usable
    if vm:
        assert vm in acc.reason


def test_dom0_baseline_labels():
    assert host_labels(["emulated", "nested", "quick-size"], dom0=True) == ["quick-size", "dom0", "virtualized-host"]
    assert host_labels(["quick-size"], dom0=True) == ["quick-size", "dom0"]
    assert host_labels(["emulated", "quick-size"]) == ["quick-size"]


def test_each_boot_refuses_the_other_hypervisors_profiles_naming_its_entry():
    assert accel.hypervisor_mismatch("xen-xvd-phy", "xen", xen_booted=True) is None
    assert accel.hypervisor_mismatch("virtio-disk", "kvm", xen_booted=False) is None
    on_kvm = accel.hypervisor_mismatch("xen-xvd-phy", "xen", xen_booted=False)
    assert on_kvm is not None and "needs the Xen hypervisor" in on_kvm and '"cloudbox on Xen" entry' in on_kvm
    assert "cloudbox-xen.conf" in on_kvm
    on_xen = accel.hypervisor_mismatch("virtio-disk", "kvm", xen_booted=True)
    assert on_xen is not None and "booted into Xen (dom0)" in on_xen and "default Linux entry" in on_xen
    assert "xen-xvd-phy" in on_xen  # a profile that does run there


def test_xl_info_facts():
    text = """host                   : cloudbox
release                : 6.12.48+deb13-amd64
nr_cpus                : 2
total_memory           : 4095
free_memory            : 1890
xen_version            : 4.20.2-pre
xen_commandline        : placeholder console=com1,vga com1=115200,8n1 dom0_mem=50%,max:4096M ucode=scan
"""
    assert accel.parse_xl_info(text) == {
        "xen": "4.20.2-pre", "xen_memory": "4095 MiB, 1890 MiB free for guests", "xen_cpus": "2",
        "dom0_boot": "dom0_mem=50%,max:4096M"}
    assert accel.parse_xl_info("") == {}


@pytest.fixture
def bound_socket():
    """A unix socket bound at a short path (sun_path holds 107 bytes), as libxl's QEMU leaves one behind."""
    with tempfile.TemporaryDirectory(prefix="cb-") as d:
        path = Path(d) / "guest.agent"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(str(path))
        assert path.is_socket()
        yield path


def test_the_agent_socket_is_removed_after_success_failure_and_ctrl_c(bound_socket):
    for ending in (None, RuntimeError("the guest's agent went silent"), KeyboardInterrupt()):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            bound_socket.unlink(missing_ok=True)
            s.bind(str(bound_socket))
        with contextlib.suppress(RuntimeError, KeyboardInterrupt), contextlib.ExitStack() as stack:
            ctx = types.SimpleNamespace(stack=stack)
            assert launch.agent_socket(ctx, bound_socket) == bound_socket  # type: ignore[arg-type]
            assert bound_socket.is_socket()  # the guest runs: its channel stays
            if ending is not None:
                raise ending
        assert not bound_socket.exists(), f"socket left after {ending!r}"


def test_only_a_socket_is_removed(tmp_path):
    plain = tmp_path / "guest.agent"
    plain.write_text("not a socket")
    launch.remove_socket(plain)
    assert plain.read_text() == "not a socket"
    launch.remove_socket(tmp_path / "absent.agent")  # the guest never bound it: nothing to do


# `xl info` on the appliance's Xen entry under QEMU TCG (Intel-branded qemu64: no VMX, so no HVM) and on hardware.
XL_INFO_TCG = """nr_cpus                : 2
virt_caps              : pv pv_directio shadow gnttab-v1 gnttab-v2
xen_caps               : xen-3.0-x86_64 xen-3.0-x86_32p
xen_version            : 4.20.2-pre
"""
XL_INFO_HW = """virt_caps              : pv hvm hvm_directio pv_directio hap shadow iommu_hap_pt_share gnttab-v1
xen_caps               : xen-3.0-x86_64 hvm-3.0-x86_32 hvm-3.0-x86_32p hvm-3.0-x86_64
"""
# On TCG's AMD qemu64,+svm (SVM without NPT) Xen 4.20 lists hvm, but Debian's Xen has no shadow paging and the CPU no
# NPT: libxl refuses every PVH and HVM guest ("neither hap nor shadow paging available").
XL_INFO_SVM_NO_NPT = """virt_caps              : pv hvm gnttab-v1 gnttab-v2
xen_caps               : xen-3.0-x86_64 hvm-3.0-x86_32 hvm-3.0-x86_32p hvm-3.0-x86_64
"""


def test_hvm_class_guests_are_refused_where_xen_has_no_hardware_virtualization(tmp_path, monkeypatch):
    tcg, hw = accel.parse_xl_info(XL_INFO_TCG), accel.parse_xl_info(XL_INFO_HW)
    assert tcg["xen_virt_caps"] == "pv pv_directio shadow gnttab-v1 gnttab-v2"
    # what `cloudbox host` shows
    assert tcg["xen_guests"] == "pv only (no VT-x/AMD-V: pvh and hvm profiles are refused)"
    assert hw["xen_guests"] == "pv, pvh, hvm"
    # the hvm word itself: hvm_directio is not it
    assert accel.xen_hvm_from(virt_caps=tcg["xen_virt_caps"]) is False
    assert accel.xen_hvm_from(virt_caps="pv hvm_directio") is False
    assert accel.xen_hvm_from(virt_caps=hw["xen_virt_caps"]) is True
    assert accel.xen_hvm_from(xen_caps="xen-3.0-x86_64") is False
    assert accel.xen_hvm_from(xen_caps="xen-3.0-x86_64 hvm-3.0-x86_32 hvm-3.0-x86_64") is True
    assert accel.xen_hvm_from() is None
    # Xen's capabilities in sysfs, readable without root, answer when `xl info` does not
    monkeypatch.setattr(accel, "dom0_facts", lambda: {"dom0_vcpus": "2"})
    assert accel.xen_hvm(_file(tmp_path / "caps", "xen-3.0-x86_64 xen-3.0-x86_32p\n")) is False
    assert accel.xen_hvm(_file(tmp_path / "caps", "xen-3.0-x86_64 hvm-3.0-x86_64\n")) is True
    for xen_type in ("pvh", "hvm"):
        why = accel.xen_type_refusal("xen-pvh-phy", xen_type, hvm=False)
        assert why is not None and "hardware virtualization (Intel VT-x or AMD-V)" in why, why
        assert "virt_caps without hvm, or without hap and shadow" in why and "real hardware with VT-x/AMD-V" in why
        assert "xen-xvd-phy" in why and "qemu64,+svm,+npt" in why
        assert accel.xen_type_refusal("xen-pvh-phy", xen_type, hvm=True) is None
        assert accel.xen_type_refusal("xen-pvh-phy", xen_type, hvm=None) is None  # not known: libxl has its say
    assert accel.xen_type_refusal("xen-xvd-phy", "pv", hvm=False) is None  # PV needs no VT-x/AMD-V
    assert "a PVH guest" in (accel.xen_type_refusal("p", "pvh", False) or "")
    assert "an HVM guest" in (accel.xen_type_refusal("p", "hvm", False) or "")


def test_the_tui_greys_hvm_class_profiles_where_the_run_refuses_them():
    no_hvm = accel.Boot(True, "xen dom0 (in a VM, emulated)", xen_hvm=False)
    assert no_hvm.refusal("xen", "pv") is None
    assert no_hvm.refusal("xen", "pvh") == "Xen PVH: needs VT-x/AMD-V with EPT/NPT, which this Xen lacks"
    assert no_hvm.refusal("xen", "hvm") == "Xen HVM: needs VT-x/AMD-V with EPT/NPT, which this Xen lacks"
    assert no_hvm.refusal("kvm", "") == "KVM profile: boot the appliance's default Linux entry"
    hw = accel.Boot(True, "xen dom0", xen_hvm=True)
    assert hw.refusal("xen", "pvh") is hw.refusal("xen", "hvm") is None
    assert accel.Boot(True, "xen dom0").refusal("xen", "pvh") is None  # not known: not greyed
    assert accel.Boot(False, "kvm").refusal("xen", "pvh") == "Xen profile: boot the appliance's Xen entry"


def test_hvm_without_a_paging_mode_is_no_hvm(tmp_path, monkeypatch):
    """Xen's hvm word alone is not enough: with neither hap (EPT/NPT) nor shadow paging libxl creates no PVH or HVM
    guest, so virt_caps decide, before Xen's capabilities (which list hvm-* all the same)."""
    svm = accel.parse_xl_info(XL_INFO_SVM_NO_NPT)
    assert svm["xen_guests"] == ("pv only (VT-x/AMD-V without EPT/NPT, and no shadow paging: pvh and hvm profiles "
                                 "are refused)")
    assert accel.xen_hvm_lack(svm["xen_virt_caps"]) == "VT-x/AMD-V without EPT/NPT, and no shadow paging"
    assert accel.xen_hvm_lack("pv pv_directio shadow") == "no VT-x/AMD-V"
    assert accel.xen_hvm_lack("pv hvm hap gnttab-v1") == ""
    assert accel.xen_hvm_lack("pv hvm shadow") == ""
    assert accel.xen_hvm_from(virt_caps=svm["xen_virt_caps"]) is False
    caps = _file(tmp_path / "caps", "xen-3.0-x86_64 hvm-3.0-x86_64\n")
    monkeypatch.setattr(accel, "dom0_facts", lambda: svm)
    assert accel.xen_hvm(caps) is False  # virt_caps first: the hvm-* entry says nothing of paging
    monkeypatch.setattr(accel, "dom0_facts", lambda: {"dom0_vcpus": "2"})  # no xl (not root): the capabilities
    assert accel.xen_hvm(caps) is True
    assert accel.xen_hvm(tmp_path / "absent") is None
