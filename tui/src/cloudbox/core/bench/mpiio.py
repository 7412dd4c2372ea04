"""Parallel I/O across guests with the field's own parts: Open MPI's mpirun, started in the first guest, reaches the
others over dropbear (the guest image's MPI layer) and runs cloudbox-mpiio there, a workload with IOR's parameters
(transfer size, block size, segments, shared file or file per process; MPI-IO, POSIX or parallel HDF5) and its output
fields. It is not IOR: IOR is not packaged for Debian. One job gives the aggregate bandwidth, as IOR computes it (every
rank's bytes over the time from the barrier that starts the phase to the last close), and each rank's own share.

The bare-metal side runs the same build with as many processes on this host, from the layer unpacked into the run's
directory (Open MPI is relocatable: OPAL_PREFIX), in a network namespace with only loopback (its listeners are
reachable from no network)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import procs
from ..errors import CloudboxError, GuestError, UsageError
from ..spec.catalogue import StorageTest, block_bytes
from ..virt.guest import Guest
from .result import MB, FioResult

PROGRAM = "cloudbox-mpiio"
# test id (catalogue.MPI_TESTS) -> (API, file per process)
APIS: dict[str, tuple[str, bool]] = {"mpiio-shared-1m": ("mpiio", False), "mpiio-fpp-1m": ("mpiio", True),
                                     "posix-shared-1m": ("posix", False), "hdf5-shared-1m": ("hdf5", False)}
KEY = "/root/.ssh/id_dropbear"
RSH_AGENT = f"dbclient -y -y -i {KEY}"  # each guest's dropbear makes its host key afresh (-R): nothing to pin
READ_METRIC = "read MB/s"


def shared(t: StorageTest) -> bool:
    return not APIS[t.id][1]


def block(size: int, t: StorageTest) -> int:
    """Each rank's bytes: the run's size in whole transfers."""
    xfer = block_bytes(t.bs)
    if size < xfer:
        raise UsageError(f"{t.id}: --size {size} is below one {t.bs} transfer; allowed: --size {xfer} or more")
    return size // xfer * xfer


def argv(t: StorageTest, path: str, size: int, ranks: int, phase: str, *, local: bool = False) -> list[str]:
    """cloudbox-mpiio's arguments for `t`'s `phase` (write: fsync before close; read: the next rank's data, so no
    rank reads its own pages back) on `path`; `local`: each rank on its own host's `path`."""
    api, fpp = APIS[t.id]
    out = [PROGRAM, "-a", api, "-o", path, "-t", t.bs, "-b", str(block(size, t)), "-s", "1"]
    out.append("-w" if phase == "write" else "-r")
    if phase == "write":
        out.append("-e")
    if fpp or local:
        out.append("-F")
    if local:
        out.append("-L")
    elif ranks > 1 and phase == "read":
        out.append("-C")
    return out


@dataclass
class MpiResult:
    """The job's figures: the aggregate as a FioResult (MB/s written, `read MB/s` in extra), each rank's own."""

    total: FioResult
    ranks: list[FioResult]
    hosts: list[str]
    library: str


def _rank_mbps(op: dict, r: int) -> float:
    """Rank r's bytes over its own time, from the phase's barrier to its close."""
    rk = op["ranks"][r]
    return rk["bytes"] / MB / rk["total_s"] if rk["total_s"] > 0 else float("nan")


def parse(test_id: str, text: str) -> MpiResult:
    """cloudbox-mpiio's JSON documents in `text` (a write job's and a read job's output): each phase's aggregate,
    as IOR computes it, and each rank's own."""
    ops: dict[str, dict] = {}
    library = ""
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except ValueError as e:
            raise CloudboxError(f"{test_id}: {PROGRAM} printed output that is not JSON ({e}): {line[:200]}") from e
        library = doc.get("mpi", library)
        ops.update({op["access"]: op for op in doc.get("ops", [])})
    if "write" not in ops or "read" not in ops:
        raise CloudboxError(f"{test_id}: {PROGRAM} reported {sorted(ops) or 'nothing'}; expected a write and a read: "
                            f"{text.strip()[-400:]}")
    w, r = ops["write"], ops["read"]
    bad = w["errors"] + r["errors"]
    if bad:
        raise CloudboxError(f"{test_id}: {bad} transfers read back other data than was written there (file offset "
                            "or writer's rank wrong): the file system lost or mixed up writes")
    if len(w["ranks"]) != len(r["ranks"]):
        raise CloudboxError(f"{test_id}: the write ran {len(w['ranks'])} ranks, the read {len(r['ranks'])}")
    total = FioResult(test_id, w["bytes"] / MB / w["total_s"], w["IOPS"], w["latency_s"] * 1e6, w["total_s"], text,
                      extra={READ_METRIC: r["bytes"] / MB / r["total_s"]})
    ranks = [FioResult(test_id, _rank_mbps(w, k), float("nan"), float("nan"), w["ranks"][k]["wrrd_s"], "",
                       extra={READ_METRIC: _rank_mbps(r, k)}) for k in range(len(w["ranks"]))]
    return MpiResult(total, ranks, [rk["host"] for rk in w["ranks"]], library)


def mpirun_argv(hosts: list[str], prog: list[str], interface: str | None = None) -> list[str]:
    """mpirun with one rank per host (in `hosts`' order), over dropbear between guests (no tree spawn: only the
    first guest holds the key), TCP on `interface` only."""
    out = ["mpirun", "--allow-run-as-root", "-np", str(len(hosts)), "--host", ",".join(f"{h}:1" for h in hosts),
           "--map-by", "node", "--mca", "plm_rsh_agent", RSH_AGENT]
    if interface:
        out += ["--mca", "btl_tcp_if_include", interface, "--mca", "oob_tcp_if_include", interface]
    return out + prog


def host_name(k: int) -> str:
    return f"cloudbox-g{k}"


def prepare_guests(guests: list[Guest], addresses: list[str], run: Callable[[Guest, str], str]) -> None:
    """Every guest named cloudbox-gK with every other's name in /etc/hosts, dropbear listening with the first
    guest's key authorised; `run(guest, script)` runs a shell script in a guest and returns its stdout."""
    hosts = "".join(f"{a} {host_name(k)}\n" for k, a in enumerate(addresses, 1))
    pub = run(guests[0], f"mkdir -p -m 0700 /root/.ssh && rm -f {KEY} && dropbearkey -t ed25519 -f {KEY} "
                         f">/dev/null 2>&1 && dropbearkey -y -f {KEY} | grep '^ssh-'").strip()
    if not pub.startswith("ssh-"):
        raise GuestError(f"dropbearkey in the first guest gave no public key: {pub[:200]!r}")
    for k, g in enumerate(guests, 1):
        run(g, f"hostname {host_name(k)} && printf %s {shlex.quote(hosts)} >> /etc/hosts && "
               f"mkdir -p -m 0700 /root/.ssh && printf '%s\\n' {shlex.quote(pub)} > /root/.ssh/authorized_keys && "
               "chmod 0600 /root/.ssh/authorized_keys && "
               "dropbear -R -s -p 22 -P /run/dropbear.pid </dev/null >/dev/null 2>&1")


def host_layer(layer: Path, dest: Path) -> Path:
    """The MPI layer (mpi.cpio; or mpi.img, the same compressed with zstd) unpacked under `dest` by cpio for the
    bare-metal side; returns its root."""
    root = dest / "mpi-root"
    root.mkdir(parents=True, exist_ok=True)
    data = layer.read_bytes()
    try:
        if layer.suffix == ".img":
            data = subprocess.run(["zstd", "-q", "-d", "-c"], input=data, capture_output=True, check=True).stdout
        subprocess.run(["cpio", "-idm", "--quiet", "--no-absolute-filenames"], input=data, cwd=root,
                       capture_output=True, check=True)
    except FileNotFoundError as e:
        raise CloudboxError(f"{e.filename} is not installed: it unpacks the MPI layer {layer} for the bare-metal side "
                            "(make deps installs it)") from e
    except subprocess.CalledProcessError as e:
        why = e.stderr.decode(errors="replace").strip()[-300:]
        raise CloudboxError(f"{e.cmd[0]} could not unpack {layer}: {why}; rebuild it with 'make guest-image'") from e
    return root


def host_env(root: Path) -> dict[str, str]:
    """The environment that runs the unpacked layer's Open MPI from `root`."""
    lib = root / "usr/lib/x86_64-linux-gnu"
    return {**os.environ, "OPAL_PREFIX": str(root / "usr"),
            "PMIX_MCA_mca_base_component_path": str(lib / "pmix2/lib/pmix"),  # PMIx's own, not relocated by OPAL
            # cloudbox-host/: the image's libraries the layer loads, for a host whose Debian lacks one
            "LD_LIBRARY_PATH": f"{lib}:{lib / 'openmpi/lib'}:{lib / 'pmix2/lib'}:{lib / 'cloudbox-host'}",
            "OMPI_MCA_mca_base_param_files": str(root / "etc/openmpi/openmpi-mca-params.conf"),
            "PATH": f"{root / 'usr/bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


def loopback_only(argv: list[str]) -> list[str]:
    """`argv` run in a network namespace of its own with only loopback up: Open MPI's mpirun listens on every
    address for its out-of-band channel and PMIx's tools (0.0.0.0 and [::], measured with ss on 4.1.4, whatever
    oob_tcp_if_include says), and a job on one host needs no network. unshare(1) execs in place, so the job keeps
    its process and session."""
    userns = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]  # a tester's own: a user namespace
    return ["unshare", *userns, "--net", "--", "/bin/sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]


def run_on_host(root: Path, parts: list[list[str]], cancelled: Callable[[], bool], cwd: Path) -> str:
    """One mpirun on this host with a rank per argv of `parts` (MPMD: each rank its own target); its output. The
    job runs in a session of its own, killed whole if the run is cancelled, and in a network namespace with only
    loopback (`loopback_only`): nothing it listens on is reachable from any network."""
    argv = [str(root / "usr/bin/mpirun"), "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader"]
    for i, prog in enumerate(parts):
        argv += ([":"] if i else []) + ["-np", "1", str(root / "usr/bin" / prog[0]), *prog[1:]]
    proc = subprocess.Popen(loopback_only(argv), env=host_env(root), cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=procs.die_with_parent())  # noqa: PLW1509 - only prctl: a killed executor's tool dies with it
    try:
        out, _ = procs.wait_cancellable(proc, cancelled, "an MPI job on bare metal")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode != 0:
        raise CloudboxError(f"mpirun on bare metal exited {proc.returncode}: {out.strip()[-600:]}")
    return str(out)
