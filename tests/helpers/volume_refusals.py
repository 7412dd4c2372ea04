"""What the volume servers refuse, tried with the real targets and the real kernel initiators of an appliance (run with
cloudbox's own interpreter there, /usr/lib/cloudbox/venv/bin/python). tests/image/volumes.bats runs both ends on one
box; tests/image/cluster.bats serves on fe1 and tries from be1.

    volume_refusals.py serve NODE ADDRESS   on the front-end (or the box): a 16 MiB scratch file served over iSCSI
                                            (tgtd, mutual CHAP), NBD (qemu-nbd with TLS, NODE's certificate only) and
                                            NVMe/TCP (nvmet, with DH-HMAC-CHAP keys both ways where the kernel has
                                            them) on ADDRESS with NODE's credentials ('-': this box's own); prints one
                                            JSON line of ports (and another node's certificate of the same CA, for the
                                            try), serves until stdin closes, then takes everything down
    volume_refusals.py try JSON             on the back-end (or the box): with the node's (the box's) credentials, a
                                            wrong CHAP secret, an NBD client without a certificate, one with a
                                            certificate of another CA, one with another node's certificate of the same
                                            CA, a host NQN not on the allow-list and a wrong DH-HMAC-CHAP key are each
                                            refused, and the right credentials are let in; then impostor targets on
                                            this host's loopback (what a host answering on the front-end's address
                                            would be): an iSCSI target without the target's secret is refused by
                                            mutual CHAP (and a one-way login shown let in), an NVMe/TCP target that
                                            asks for no authentication is reported as the kernel treats it; one line
                                            each; exit 1 if anything that should be refused was let in
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from cloudbox.core import procs
from cloudbox.core.disks.volumes import hostattach, iscsi, nbd, nodecreds, nvmet, pki
from cloudbox.core.errors import CloudboxError


def _creds(node: str):
    if node == "-":
        return iscsi.chap(), hostattach.nvme_host(), pki.ensure().client_dir
    if node == "@node":  # this back-end's set from its front-end
        c = nodecreds.on_node()
        return c.chap, c.nvme, c.nbd_dir
    c = nodecreds.make(node, pki.ensure())
    return c.chap, c.nvme, c.nbd_dir


def serve(node: str, address: str) -> int:
    chap, ident, _ = _creds(node)
    work = Path(tempfile.mkdtemp(prefix="refusals-", dir="/var/tmp"))
    f = work / "scratch.img"
    with open(f, "wb") as out:
        os.posix_fallocate(out.fileno(), 0, 16 << 20)
    exps: list = []
    ca = pki.ensure((f"IP:{address}",))
    other = nodecreds.make(OTHER, ca)  # another node of the same front-end
    try:
        exps.append(iscsi.start("refusals", str(f), chap, log=work / "tgtd.log", host=address))
        client = pki.identity(_creds(node)[2] / "client-cert.pem")
        exps.append(nbd.start("refusals", str(f), ca.server_dir, client=client, log=work / "qemu-nbd.log",
                              host=address))
        nvmet.load()
        auth = nvmet.auth_supported()
        exps.append(nvmet.start("refusals", str(f), allowed={ident.nqn: ident.key if auth else ""},
                                run_uuid="refusals-" + os.urandom(8).hex(), host=address,
                                ctrl_keys={ident.nqn: ident.ctrl_key}))
        print(json.dumps({"host": address, "iscsi": exps[0].port, "iqn": exps[0].iqn, "nbd": exps[1].port,
                          "nvme": exps[2].port, "nqn": exps[2].nqn, "auth": auth, "node": node,
                          "other": {n: (other.nbd_dir / n).read_text() for n in ("client-cert.pem",
                                                                                 "client-key.pem")}}), flush=True)
        sys.stdin.read()  # until the test closes it
    finally:
        for e in reversed(exps):
            e.stop()
        nodecreds.forget(OTHER)
        shutil.rmtree(work, ignore_errors=True)
    return 0


OTHER = "refusals-other"  # the name of the other node whose certificate is tried


def _refused(what: str, attempt, *, want_refused: bool = True) -> bool:
    try:
        att = attempt()
    except CloudboxError as e:
        print(f"{what}: refused ({str(e)[-160:]})" if want_refused else f"{what}: WRONGLY REFUSED ({e})")
        return want_refused
    if att is not None:
        att.detach()
    print(f"{what}: let in" if not want_refused else f"{what}: WRONGLY LET IN")
    return not want_refused


def _nbd_client(host: str, port: int, ca: Path, certs: Path | None) -> subprocess.CompletedProcess[str]:
    """nbd-client checking the server against `ca`, presenting the certificate in `certs` (none: no certificate)."""
    dev = hostattach._free_nbd()
    cmd = ["nbd-client", host, str(port), dev, "-name", "refusals", "-nonetlink", "-tlshostname", host,
           "-cacertfile", str(ca)]
    if certs is not None:
        cmd += ["-certfile", str(certs / "client-cert.pem"), "-keyfile", str(certs / "client-key.pem")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if r.returncode == 0:
        subprocess.run(["nbd-client", "-d", dev], capture_output=True)
    return r


def attempt(data: dict) -> int:
    chap, ident, nbd_dir = _creds("@node" if data["node"] != "-" else "-")
    ca = nbd_dir / "ca-cert.pem"
    host = data["host"]
    ok = True
    wrong = iscsi.Chap(chap.initiator, chap.user, "0" * 32)
    ok &= _refused("iSCSI with a wrong CHAP secret",
                   lambda: hostattach.attach_iscsi(host, data["iscsi"], data["iqn"], wrong))
    stranger = iscsi.Chap("iqn.2026-11.org.example:stranger", chap.user, chap.secret)
    ok &= _refused("iSCSI from an initiator name not on the allow-list",
                   lambda: hostattach.attach_iscsi(host, data["iscsi"], data["iqn"], stranger))
    ok &= _refused("iSCSI with this node's own CHAP secret",
                   lambda: hostattach.attach_iscsi(host, data["iscsi"], data["iqn"], chap), want_refused=False)
    hostattach._modprobe("nbd")
    r = _nbd_client(host, data["nbd"], ca, None)
    refused = r.returncode != 0
    print(f"NBD without a client certificate: {'refused' if refused else 'WRONGLY LET IN'} "
          f"({(r.stderr or r.stdout).strip()[-160:]})")
    ok &= refused
    other = Path(tempfile.mkdtemp(prefix="otherca-"))
    try:  # a certificate of another CA: a client that was never given this box's (or front-end's)
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", str(other / "client-key.pem"), "-out", str(other / "client-cert.pem"),
                        "-days", "1", "-subj", "/CN=stranger"], capture_output=True, check=True)
        r = _nbd_client(host, data["nbd"], ca, other)
        refused = r.returncode != 0
        print(f"NBD with a certificate of another CA: {'refused' if refused else 'WRONGLY LET IN'} "
              f"({(r.stderr or r.stdout).strip()[-160:]})")
        ok &= refused
    finally:
        shutil.rmtree(other, ignore_errors=True)
    theirs = Path(tempfile.mkdtemp(prefix="othernode-"))
    try:  # another node's certificate, of the same CA: the export is this node's alone
        for name, pem in data["other"].items():
            (theirs / name).write_text(pem)
        os.chmod(theirs / "client-key.pem", 0o600)
        r = _nbd_client(host, data["nbd"], ca, theirs)
        refused = r.returncode != 0
        print(f"NBD with another node's certificate of the same CA: {'refused' if refused else 'WRONGLY LET IN'} "
              f"({(r.stderr or r.stdout).strip()[-160:]})")
        ok &= refused
    finally:
        shutil.rmtree(theirs, ignore_errors=True)
    r = _nbd_client(host, data["nbd"], ca, nbd_dir)
    print(f"NBD with this node's own certificate: {'let in' if r.returncode == 0 else 'WRONGLY REFUSED'}"
          + ("" if r.returncode == 0 else f" ({(r.stderr or r.stdout).strip()[-160:]})"))
    ok &= r.returncode == 0
    outsider = hostattach.new_nvme_host("stranger")
    ok &= _refused("NVMe/TCP from a host NQN not on the allow-list",
                   lambda: hostattach.attach_nvme(host, data["nvme"], data["nqn"], outsider, authenticate=False))
    if data["auth"]:
        bad = hostattach.NvmeHost(ident.nqn, ident.hostid, hostattach.dhchap_secret())
        ok &= _refused("NVMe/TCP with a wrong DH-HMAC-CHAP key",
                       lambda: hostattach.attach_nvme(host, data["nvme"], data["nqn"], bad, authenticate=True))
    else:
        print("NVMe/TCP with a wrong DH-HMAC-CHAP key: not tried (this target's kernel checks no keys)")
    ok &= _refused("NVMe/TCP with this node's own identity",
                   lambda: hostattach.attach_nvme(host, data["nvme"], data["nqn"], ident, authenticate=data["auth"]),
                   want_refused=False)
    ok &= impostors(data, chap, ident)
    return 0 if ok else 1


def impostors(data: dict, chap: iscsi.Chap, ident: hostattach.NvmeHost) -> bool:
    """Targets on this host's loopback that do not hold the target's secrets, as a host answering on the front-end's
    address would be: the same target names, every initiator let in, no authentication asked."""
    work = Path(tempfile.mkdtemp(prefix="impostor-", dir="/var/tmp"))
    f = work / "theirs.img"
    with open(f, "wb") as out:
        os.posix_fallocate(out.fileno(), 0, 16 << 20)
    ok = True
    port = procs.free_port("127.0.0.1")
    control = iscsi.control_port(port)
    child = procs.Child.start(["tgtd", "-f", "-C", str(control), "--iscsi", f"portal=127.0.0.1:{port}"],
                              log=work / "tgtd.log", ready=lambda pid: procs.listens(pid, port), serving="an impostor",
                              ready_is=f"listen on 127.0.0.1:{port}", timeout=30, death_signal=signal.SIGKILL)
    try:
        iscsi.tgtadm(control, "--mode", "target", "--op", "new", "--tid", "1", "--targetname", data["iqn"])
        iscsi.tgtadm(control, "--mode", "logicalunit", "--op", "new", "--tid", "1", "--lun", "1", "--backing-store",
                     str(f))
        iscsi.tgtadm(control, "--mode", "target", "--op", "bind", "--tid", "1", "--initiator-address", "ALL")
        ok &= _refused("iSCSI from an impostor target without the target's secret (mutual CHAP)",
                       lambda: hostattach.attach_iscsi("127.0.0.1", port, data["iqn"], chap))
        one_way = iscsi.Chap(chap.initiator, chap.user, chap.secret)
        _refused("iSCSI from the same impostor with one-way CHAP (what mutual CHAP closes)",
                 lambda: hostattach.attach_iscsi("127.0.0.1", port, data["iqn"], one_way), want_refused=False)
    finally:
        with contextlib.suppress(CloudboxError):
            iscsi.tgtadm(control, "--mode", "system", "--op", "delete", lld=False)
        child.stop()
    exp = None
    try:  # the kernel's host checks the target's key only when the target asks to authenticate: reported, not judged
        nvmet.load()
        exp = nvmet.start("impostor", str(f), allowed={ident.nqn: ""}, run_uuid="impostor-" + os.urandom(8).hex())
        att = hostattach.attach_nvme("127.0.0.1", exp.port, exp.nqn, ident, authenticate=True)
        att.detach()
        print("NVMe/TCP from an impostor target asking no authentication: let in (the kernel checks the target's "
              "key only when the target asks to authenticate)")
    except CloudboxError as e:
        print(f"NVMe/TCP from an impostor target asking no authentication: refused ({str(e)[-160:]})")
    finally:
        if exp is not None:
            exp.stop()
        shutil.rmtree(work, ignore_errors=True)
    return ok


if __name__ == "__main__":
    match sys.argv[1:]:
        case ["serve", node, address]:
            sys.exit(serve(node, address))
        case ["try", blob]:
            sys.exit(attempt(json.loads(blob)))
        case _:
            print(__doc__, file=sys.stderr)
            sys.exit(2)
