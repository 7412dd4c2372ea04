"""The network-volume schemes (disk.volume = "<scheme>:<name>"): one record of facts each, registered in one table.

What cloudbox knows of a scheme is declared here once: its name and title, the server that serves it and its Debian
package, the host kernel's initiator and the program it needs, the disk.attach modes cloudbox implements for it
(QEMU's own client among them or not), how a front-end names a volume it serves (the URI form core.spec.remote
parses) and the wording of its baseline. What a run does with a scheme (serve, attach, describe its guards) is
core.disks.volumes.transports, one class per scheme keyed by the same names, as mkosi keeps a distribution's name in
its config and its installer beside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = r"[a-z0-9][a-z0-9.:_-]{0,222}"  # IQNs, NQNs and volume names: no spaces, commas, slashes or quotes


@dataclass(frozen=True)
class Scheme:
    """One scheme's facts; the texts are the wording runs and results show."""

    name: str  # disk.volume's prefix
    title: str  # in prose and tables
    server: str  # the program that serves it on this host ("nvmet": the kernel's own target)
    package: str  # the server's Debian package
    host_module: str  # the host kernel's initiator (disk.attach = host) or client
    attach: tuple[str, ...]  # the disk.attach modes cloudbox implements for it ("qemu": QEMU's own client)
    block: bool = True  # a block volume kept in volumes.db; False: a file system the run makes itself (NFS)
    layer2: bool = False  # served on a link, with no address or port (AoE)
    host_tool: str = ""  # the program the host's attachment needs beside its kernel module ("" none)
    host_tool_package: str = ""  # and its Debian package
    uri: re.Pattern[str] | None = None  # how a front-end names the volume it serves a back-end's run
    uri_form: str = ""  # that form, for people
    served_here: str = ""  # who serves it on this host to this host's own kernel
    served_to_guest: str = ""  # how it is served on the guest's bridge ({ip}: this host's address there)
    baseline: str = ""  # how the host domain measures it for the baseline without a kernel initiator
    front_end_baseline: str = ""  # how a back-end's host measures it when the front-end serves it
    # the baseline's driver, as the results' driver column words it: (a test's label, the words; "" any test).
    # {vers} and {writes}: the NFS export's version and write mode.
    baseline_drivers: tuple[tuple[str, str], ...] = ()

    @property
    def qemu(self) -> bool:
        """QEMU's own client attaches it (disk.attach = qemu)."""
        return "qemu" in self.attach


NBD = Scheme(
    "nbd", "NBD", "qemu-nbd", "qemu-utils", "nbd", ("host", "guest", "qemu"),
    host_tool="nbd-client", host_tool_package="nbd-client",
    uri=re.compile(rf"nbds://(?P<host>[0-9.]+):(?P<port>[0-9]{{1,5}})/(?P<target>{_NAME})"),
    uri_form="nbds://HOST:PORT/NAME",
    served_here="qemu-nbd with TLS on 127.0.0.1",
    served_to_guest="over NBD with TLS on {ip}",
    baseline="the same export from the host domain: fio's nbd engine (libnbd, user space)",
    baseline_drivers=(("", "NBD, fio nbd engine (user space)"),))
AOE = Scheme(
    "aoe", "AoE", "vblade", "vblade", "aoe", ("host", "guest"), layer2=True,
    uri=re.compile(r"aoe:(?P<target>e(?P<shelf>[0-9]{1,5})\.(?P<slot>[0-9]{1,3}))@(?P<host>[0-9.]+)"),
    uri_form="aoe:eS.N@HOST",
    served_here="vblade on a veth pair of the run's own (AoE has no authentication)",
    served_to_guest="over AoE (layer 2, no authentication: the guest's bridge only)")
ISCSI = Scheme(
    "iscsi", "iSCSI", "tgtd", "tgt", "iscsi_tcp", ("host", "guest", "qemu"),
    host_tool="iscsiadm", host_tool_package="open-iscsi",
    uri=re.compile(rf"iscsi://(?P<host>[0-9.]+):(?P<port>[0-9]{{1,5}})/(?P<target>{_NAME})/(?P<lun>[0-9]{{1,3}})"),
    uri_form="iscsi://HOST:PORT/IQN/LUN",
    served_here="tgtd with CHAP on 127.0.0.1",
    served_to_guest="over iSCSI with CHAP on {ip}",
    baseline=("the same target from the host domain through libiscsi, the library of QEMU's initiator (user space): "
              "direct reads by iscsi-perf after data was laid over the whole volume, every other fio and dd test "
              "through QEMU's libiscsi in qemu-nbd by fio's nbd engine; IOzone and Bonnie++ not measured"),
    baseline_drivers=(("iscsi-perf", "iSCSI, libiscsi's iscsi-perf (user space)"),
                      ("", "iSCSI, QEMU's libiscsi via qemu-nbd, fio nbd engine (user space)")))
NVME_TCP = Scheme(
    "nvme-tcp", "NVMe/TCP", "nvmet", "the kernel", "nvme_tcp", ("host", "guest"),
    uri=re.compile(rf"nvme\+tcp://(?P<host>[0-9.]+):(?P<port>[0-9]{{1,5}})/(?P<target>{_NAME})"),
    uri_form="nvme+tcp://HOST:PORT/NQN",
    served_here="the kernel's NVMe/TCP target (nvmet) on 127.0.0.1",
    served_to_guest="over NVMe/TCP (the kernel's nvmet, this box's host NQN only) on {ip}")
NFS = Scheme(
    "nfs", "NFS", "ganesha.nfsd", "nfs-ganesha", "nfsv4", ("guest",), block=False,
    served_to_guest="over NFSv4 (nfs-ganesha) on {ip}, to this run's guests' addresses only",
    baseline=("the export's directory on the server's disk from the host domain, without NFS: this kernel has no NFS "
              "client (the guest's over the server's own disk is NFS's cost)"),
    front_end_baseline=("the same export mounted by this back-end's host (its kernel's NFSv4 client, the guest's mount "
                        "options): the guest's figure against it is the virtualization's cost"),
    baseline_drivers=(("", "NFSv{vers}, the host's kernel client ({writes})"),))

# Every scheme, in the order `cloudbox volume list` names them.
SCHEMES: dict[str, Scheme] = {s.name: s for s in (NBD, AOE, ISCSI, NVME_TCP, NFS)}


def scheme_of(volume: str) -> Scheme | None:
    """The scheme of disk.volume `volume` ("nbd:ebs"); None for none cloudbox knows."""
    return SCHEMES.get(volume.partition(":")[0])


def attached_by(mode: str) -> tuple[Scheme, ...]:
    """The schemes disk.attach = `mode` is implemented for."""
    return tuple(s for s in SCHEMES.values() if mode in s.attach)
