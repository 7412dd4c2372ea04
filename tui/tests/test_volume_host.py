"""Volumes attached by a host's kernel and served to back-ends, the parts that run without the initiators' kernel
modules (which this build host lacks): the checks before a run, the front-end's volume address a node's run is
given, a node's own credentials made, sent and installed, NVMe's DH-HMAC-CHAP secret format, and the presets. The
attachments themselves run in the appliance (tests/image/volumes.bats and the cluster suite)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import zlib
from pathlib import Path

import pytest

from cloudbox.core.disks.volumes import attach, hostattach, nodecreds, nvmet, pki, transports
from cloudbox.core.errors import CloudboxError, UsageError
from cloudbox.core.spec import profiles, remote
from cloudbox.core.spec.runspec import RunSpec
from cloudbox.core.studies import loading


@pytest.mark.parametrize(("uri", "want"), [
    ("iscsi://10.73.0.1:3260/iqn.2026-11.org.cloudbox:vol.ebs/1",
     ("iscsi", "10.73.0.1", 3260, "iqn.2026-11.org.cloudbox:vol.ebs", 1)),
    ("nbds://10.73.0.1:10809/ebs", ("nbd", "10.73.0.1", 10809, "ebs", 0)),
    ("nvme+tcp://10.73.0.1:4420/nqn.2026-11.org.cloudbox:vol.ebs",
     ("nvme-tcp", "10.73.0.1", 4420, "nqn.2026-11.org.cloudbox:vol.ebs", 0)),
    ("aoe:e4711.0@10.73.0.1", ("aoe", "10.73.0.1", 0, "e4711.0", 0)),
])
def test_the_front_ends_volume_address_is_parsed(uri, want):
    rv = remote.parse(uri)
    assert (rv.scheme, rv.host, rv.port, rv.target, rv.lun) == want
    if rv.scheme == "aoe":
        assert rv.shelf_slot == (4711, 0)


@pytest.mark.parametrize("uri", [
    "iscsi://10.73.0.1:3260/iqn.x,hostnqn=evil/1",  # a comma would add an option to the kernel's connect string
    "nvme+tcp://10.73.0.1:4420/nqn x",
    "nbds://fe1.local:10809/ebs",  # a name, not an address
    "nbds://10.73.0.1:70000/ebs",
    "nbds://10.73.0.1:10809/ebs; rm -rf /",
    "aoe:e65535.0@10.73.0.1",  # the broadcast shelf
    "aoe:e1.255@10.73.0.1",
    "file:///etc/passwd",
    "",
])
def test_a_hostile_volume_address_is_refused_naming_the_forms(uri):
    with pytest.raises(UsageError, match="allowed: iscsi://HOST:PORT/IQN/LUN"):
        remote.parse(uri)


def test_a_run_spec_carries_the_volume_address_only_when_set():
    assert "volume_uri" not in RunSpec(profile="virtio-disk").as_dict()  # older records read as before
    spec = RunSpec(profile="kvm-ebs-nvme", suite="storage", volume_uri="nvme+tcp://10.73.0.1:4420/nqn.a:vol.ebs")
    spec.validate()
    assert spec.as_dict()["volume_uri"] == "nvme+tcp://10.73.0.1:4420/nqn.a:vol.ebs"
    with pytest.raises(UsageError, match="front-end's volume"):
        RunSpec(profile="kvm-ebs-nvme", volume_uri="nvme+tcp://10.73.0.1:4420/a,b").validate()


def test_host_attach_needs_the_kernels_initiator_and_says_which():
    for scheme, module in (("aoe", "aoe"), ("iscsi", "iscsi_tcp"), ("nbd", "nbd"), ("nvme-tcp", "nvme_tcp")):
        with pytest.raises(attach.AttachRefused) as e:
            attach.check_attach(scheme, "host", has_module=lambda m: False)
        assert f"this kernel has no {module}" in e.value.summary
        assert f"its {module} driver" in str(e.value)
        attach.check_attach(scheme, "host", has_module=lambda m: True, tool_problem=lambda s: "")
    assert hostattach.tool_problem("aoe") == "" and hostattach.tool_problem("nvme-tcp") == ""  # kernel only
    if shutil.which("iscsiadm") is None:
        assert "Debian package open-iscsi" in hostattach.tool_problem("iscsi")


def test_nvme_tcp_needs_the_kernels_target():
    assert nvmet.problem(lambda m: True) == ""
    assert "nvmet, nvmet_tcp" in nvmet.problem(lambda m: False)
    if not attach.kernel_module_available("nvmet"):  # this build host: refused before anything is made
        with pytest.raises(attach.AttachRefused, match="NVMe/TCP: no nvmet in this kernel"):
            try:
                attach.preflight("nvme-tcp:ebs", "guest", 4 << 20)
            except attach.AttachRefused as e:
                raise attach.AttachRefused(e.summary) from None


def test_the_dhchap_secret_is_in_the_kernels_format():
    s = hostattach.dhchap_secret()
    head, hash_id, body, tail = s.split(":")
    assert (head, hash_id, tail) == ("DHHC-1", "00", "")
    raw = base64.b64decode(body)
    key, crc = raw[:-4], raw[-4:]
    assert len(key) == 32 and zlib.crc32(key).to_bytes(4, "little") == crc
    assert hostattach.dhchap_secret() != s
    ident = hostattach.NvmeHost("nqn.x:host.a", "h-1", s)
    opts = hostattach.fabrics_options("10.0.0.1", 4420, "nqn.x:vol.v", ident, authenticate=True)
    assert opts.endswith(f",dhchap_secret={s}") and "hostnqn=nqn.x:host.a" in opts
    assert "dhchap" not in hostattach.fabrics_options("10.0.0.1", 4420, "nqn.x:vol.v", ident, authenticate=False)
    assert s not in repr(ident)


def test_the_target_answers_a_keyed_host_with_a_key_of_its_own(tmp_path, monkeypatch):
    """Bidirectional DH-HMAC-CHAP: the host is given the target's key (dhchap_ctrl_secret), and the target's host
    entry holds it (dhchap_ctrl_key) where the kernel has it, so a host answering on the target's address without
    it cannot hand this host a disk it made."""
    ident = hostattach.new_nvme_host("t-1")
    assert ident.ctrl_key and ident.ctrl_key != ident.key and ident.ctrl_key not in repr(ident)
    opts = hostattach.fabrics_options("10.0.0.1", 4420, "nqn.x:vol.v", ident, authenticate=True)
    assert opts.endswith(f",dhchap_secret={ident.key},dhchap_ctrl_secret={ident.ctrl_key}")
    assert "dhchap" not in hostattach.fabrics_options("10.0.0.1", 4420, "nqn.x:vol.v", ident, authenticate=False)
    # the target's side, on a configfs tree as the kernel lays it out (the entry's attributes made by the kernel)
    base = tmp_path / "nvmet"
    for d in ("hosts", "subsystems", "ports"):
        (base / d).mkdir(parents=True)
    real_mkdir = Path.mkdir

    def kernel_mkdir(self, *a, **kw):
        real_mkdir(self, *a, **kw)
        if self.parent == base / "hosts":
            for attr in ("dhchap_key", "dhchap_ctrl_key"):
                (self / attr).write_text("")
        if self.parent == base / "subsystems":
            for d in ("allowed_hosts", "namespaces"):
                real_mkdir(self / d)
        if self.parent == base / "ports":
            real_mkdir(self / "subsystems")
    monkeypatch.setattr(Path, "mkdir", kernel_mkdir)
    monkeypatch.setattr(nvmet, "load", lambda configfs=nvmet.CONFIGFS: base)
    monkeypatch.setattr(nvmet, "_listening", lambda port: True)
    exp = nvmet.start("v", str(tmp_path / "vol"), allowed={ident.nqn: ident.key}, run_uuid="run-1", port=4420,
                      configfs=tmp_path, ctrl_keys={ident.nqn: ident.ctrl_key})
    entry = base / "hosts" / ident.nqn
    assert (entry / "dhchap_key").read_text() == ident.key and (entry / "dhchap_ctrl_key").read_text() == ident.ctrl_key
    assert exp.authenticated and exp.mutual
    assert "both ways" in transports.block_transport("nvme-tcp").security(exp, "host")


def test_the_box_nvme_identity_is_made_once_and_private(state):
    a = hostattach.nvme_host()
    f = hostattach.nvme_host_file()
    assert stat.S_IMODE(f.stat().st_mode) == 0o600 and stat.S_IMODE(f.parent.stat().st_mode) == 0o700
    assert hostattach.nvme_host() == a and a.nqn.startswith(nvmet.NQN_PREFIX + ":host.box-") and a.ctrl_key
    f.write_text(json.dumps({"nqn": a.nqn, "hostid": a.hostid, "key": a.key}))  # made before targets had keys
    older = hostattach.nvme_host()
    assert (older.nqn, older.key) == (a.nqn, a.key) and older.ctrl_key and hostattach.nvme_host() == older
    f.write_text("{")
    with pytest.raises(CloudboxError, match="remove the file to make a new one"):
        hostattach.nvme_host()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl (the NBD CA)")
def test_a_nodes_credentials_are_its_own_and_arrive_whole(state, tmp_path):
    ca = pki.ensure(("IP:10.73.0.1",))
    assert "IP:10.73.0.1" in pki.server_names(ca.server_dir / "server-cert.pem")
    be1 = nodecreds.make("be1", ca)
    be2 = nodecreds.make("be2", ca)
    assert nodecreds.make("be1", ca) == be1  # kept, not made again
    assert be1.chap.secret != be2.chap.secret and be1.nvme.nqn != be2.nvme.nqn and be1.fingerprint != be2.fingerprint
    assert stat.S_IMODE(nodecreds.front_end_dir("be1").stat().st_mode) == 0o700
    cert = be1.nbd_dir / "client-cert.pem"
    r = os.popen(f"openssl verify -CAfile {ca.base / 'ca-cert.pem'} {cert}").read()
    assert r.strip().endswith(": OK")
    payload = json.loads(nodecreds.payload(be1, "fe1"))
    assert payload["fingerprint"] == be1.fingerprint
    # on the node: installed whole, private, and checked against the fingerprint it came with
    node_base = tmp_path / "node" / "pki" / "front-end"
    got = nodecreds.install(payload, node_base)
    assert got.chap == be1.chap and got.nvme == be1.nvme and got.fingerprint == be1.fingerprint
    assert stat.S_IMODE((node_base / "nbd" / "client-key.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE(node_base.stat().st_mode) == 0o700
    assert nodecreds.installed_fingerprint(node_base) == be1.fingerprint
    bent = {**payload, "chap": {**payload["chap"], "secret": "0" * 32}}
    with pytest.raises(CloudboxError, match="fingerprint does not match"):
        nodecreds.install(bent, node_base)
    assert nodecreds.installed_fingerprint(node_base) == be1.fingerprint, "a refused set leaves the last one"
    with pytest.raises(CloudboxError, match="incomplete"):
        nodecreds.install({k: v for k, v in payload.items() if k != "nbd"}, node_base)
    assert be1.chap.mutual and be1.nvme.ctrl_key and got.chap.target_secret == be1.chap.target_secret
    # a set kept from before targets had secrets of their own gets them, and so a fingerprint the node lacks
    ids = nodecreds.front_end_dir("be1") / "ids.json"
    data = json.loads(ids.read_text())
    data["chap"] = {k: data["chap"][k] for k in ("initiator", "user", "secret")}
    data["nvme"] = {k: data["nvme"][k] for k in ("nqn", "hostid", "key")}
    ids.write_text(json.dumps(data))
    upgraded = nodecreds.make("be1", ca)
    assert upgraded.chap.secret == be1.chap.secret and upgraded.chap.mutual and upgraded.nvme.ctrl_key
    assert upgraded.fingerprint != be1.fingerprint and nodecreds.make("be1", ca) == upgraded
    nodecreds.forget("be1")
    assert not nodecreds.front_end_dir("be1").exists()
    assert nodecreds.make("be1", ca).chap.secret != be1.chap.secret  # enrolled again: new secrets


def test_a_node_without_credentials_is_told_how_to_get_them(state):
    with pytest.raises(CloudboxError, match="installs them at enrolment and before each volume run"):
        nodecreds.on_node()
    assert nodecreds.installed_fingerprint() == ""


def test_the_ebs_presets_and_a_study_can_run_them():
    want = {"kvm-ebs-aoe": ("aoe:ebs", "host", "scsi-lsi"), "kvm-ebs-aoe-virtio": ("aoe:ebs", "host", "virtio-blk"),
            "kvm-ebs-iscsi-host": ("iscsi:ebs", "host", "scsi-lsi"),
            "kvm-ebs-nvme": ("nvme-tcp:ebs", "host", "virtio-blk"),
            "kvm-ebs-nvme-guest": ("nvme-tcp:ebs", "guest", "virtio-blk")}
    for name, (volume, mode, bus) in want.items():
        p = profiles.find_profile(name)
        assert (p.disk.volume, p.disk.attach, p.disk.bus) == (volume, mode, bus), name
        assert loading.cannot_run(p) is None, name
    modern = profiles.find_profile("kvm-ebs-nvme")
    assert (modern.disk.cache, modern.disk.io) == ("none", "io_uring")


def test_qemu_attach_is_refused_across_nodes(state):
    with pytest.raises(attach.AttachRefused, match="allowed on a back-end: disk.attach = host or guest"):
        attach.export_for_node("iscsi:ebs", "qemu", node="be1", creds=None, run_uuid="r",  # type: ignore[arg-type]
                               work_dir=state / "w", size_bytes=1, address="10.73.0.1", link="cbpriv0")
    assert not (state / "w").exists()


def test_a_front_end_without_the_server_refuses_naming_its_package(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda prog: None)
    with pytest.raises(attach.AttachRefused, match=r"served by vblade, which is not installed \(Debian package vblade"):
        attach._server_check("aoe")


def test_the_host_attach_leftovers_listing_reads_this_host():
    left = hostattach.leftovers()
    assert set(left) == {"iscsi", "nvme", "nbd", "aoe"}
    if not Path("/sys/class/iscsi_session").exists():
        assert left["iscsi"] == []
