"""Work on an enrolled node from the front-end, over the pinned SSH (the same OpenSSH, keys and pins as libvirt's
qemu+ssh transport): propagate the benchmark guest image from the front-end's store to the node, start a run
there, follow its events live, cancel it, and fetch its result for the front-end's database.

The node does the work with its own cloudbox: `cloudbox node local OP` (cli/node.py), run through SSH by the
front-end's management key, is the node's side of each step. Nothing listens on the node for this: it is a
command over SSH, like virt-ssh-helper for libvirt. The node's run is its own executor (the same code as a
local run: bare-metal baseline, guest, disk sampler, cleanup on failure), started detached there so a dropped
connection cannot leave a half-cleaned guest; the front-end's executor mirrors it (runner.Executor, spec.node).

Image propagation is study B's measurement: the kernel, initramfs and manifest travel as one tar stream; the
node unpacks it into <its state dir>/images/<image id>.part, checks every file's SHA-256 and renames the
directory into place. Transfer time is taken on the front-end from the first byte sent to the node's "received"
line, so it includes writing the files on the node; the check is timed apart.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .. import paths
from ..errors import CloudboxError
from ..guestimage import GuestImage
from ..provenance import Propagation, RemoteRun
from .registry import NodeRecord, Registry

IMAGE_FILES = ("vmlinuz", "initrd.img", "manifest.json")
SUMS = "SHA256SUMS"
CHUNK = 1024 * 1024
KEEP_IMAGES = 3  # image ids a node keeps in its cache (the newest)
PATIENT_CONNECT_S = 30  # ssh ConnectTimeout for a run's own traffic
PATIENT_KEEPALIVE_COUNT = 24  # x the registry's 5 s ServerAliveInterval: 2 min of silence before the stream drops
REATTACH_WITHIN_S = 300.0  # a run's dropped event stream is re-attached for this long before the node counts as lost


class NodeError(CloudboxError):
    """A command on a node failed, or the node could not be reached."""


# ------------------------------------------------------------------------------------------------ shell
@dataclass
class NodeShell:
    """Commands on one node through the registry's pinned ssh wrapper (root, the management key)."""

    node: NodeRecord
    base: list[str]

    @classmethod
    def for_node(cls, reg: Registry, node: NodeRecord) -> NodeShell:
        return cls(node, reg.ssh_args(node))

    @property
    def where(self) -> str:
        return f"node {self.node.name} ({self.node.address})"

    def argv(self, *cmd: str, patient: bool = False) -> list[str]:
        """ssh's argv for `cmd`. patient: for a run's own traffic (its event stream, fetch, cancel), which must
        ride out a node that is busy, not gone: a TCG node under a queue-depth-32 fio once left sshd silent past
        the registry's 5 s connect timeout and 10 s keepalive (a health check stays quick: it is what says down)."""
        import shlex

        base = list(self.base)
        if patient:
            at = base.index("--") if "--" in base else len(base) - 1
            base[at:at] = ["-o", f"ConnectTimeout={PATIENT_CONNECT_S}",
                           "-o", f"ServerAliveCountMax={PATIENT_KEEPALIVE_COUNT}"]
        return [*base, shlex.join(cmd)]

    def run(self, *cmd: str, input: bytes | None = None, timeout: float = 60.0, what: str = "",
            patient: bool = False) -> str:
        what = what or " ".join(cmd[:3])
        try:
            out = subprocess.run(self.argv(*cmd, patient=patient), input=input, capture_output=True, timeout=timeout,
                                 stdin=subprocess.DEVNULL if input is None else None)
        except subprocess.TimeoutExpired:
            raise NodeError(f"{self.where}: {what} did not finish within {timeout:g} s") from None
        except OSError as e:
            raise NodeError(f"{self.where}: cannot run ssh: {e}") from None
        if out.returncode != 0:
            raise NodeError(f"{self.where}: {what} failed: {explain(out.returncode, out.stderr)}")
        return out.stdout.decode(errors="replace")

    def popen(self, *cmd: str, stdin: int | None = subprocess.DEVNULL,
              patient: bool = False) -> subprocess.Popen[bytes]:
        try:
            return subprocess.Popen(self.argv(*cmd, patient=patient), stdin=stdin, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
        except OSError as e:
            raise NodeError(f"{self.where}: cannot run ssh: {e}") from None


def explain(rc: int, stderr: bytes | str) -> str:
    """ssh's exit status and the last useful lines of stderr: 255 is ssh's own failure (unreachable, key refused)."""
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("@")]
    tail = "; ".join(lines[-3:]) or "no message"
    if rc == 255:
        return f"ssh could not reach it or was refused (exit 255): {tail}"
    if rc == 127:
        return f"cloudbox is not installed there (exit 127): {tail}"
    return f"exit status {rc}: {tail}"


# ------------------------------------------------------------------------------------------ propagation
def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def file_sums(image: GuestImage) -> dict[str, str]:
    return {name: sha256_file(image.directory / name) for name in IMAGE_FILES}


def image_id(sums: dict[str, str]) -> str:
    """The image's identity: a hash over its files' hashes (the same image has the same id everywhere)."""
    return hashlib.sha256("".join(f"{sums[n]}  {n}\n" for n in IMAGE_FILES).encode()).hexdigest()[:16]


class _Counting(io.RawIOBase):
    """A write-only stream that forwards to `out` and counts bytes (and calls `tick` as they go)."""

    def __init__(self, out: IO[bytes], tick: Callable[[int], None]):
        self.out, self.tick, self.count = out, tick, 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        n = self.out.write(b)
        self.count += len(b)
        self.tick(self.count)
        return n if n is not None else len(b)


def propagate_image(shell: NodeShell, image: GuestImage, *, force: bool = False,
                    progress: Callable[[int, int], None] | None = None,
                    cancelled: Callable[[], bool] = lambda: False) -> Propagation:
    """Make sure the node has `image` in its cache; copy it (timed) when it has not, or always with force."""
    sums = file_sums(image)
    iid = image_id(sums)
    t0 = time.monotonic()
    if not force:
        out = json.loads(shell.run("cloudbox", "node", "local", "has-image", iid, timeout=120,
                                   what="checking its guest image cache") or "{}")
        if out.get("present"):
            return Propagation(shell.node.name, iid, 0, 0.0, time.monotonic() - t0, 0.0, True, out["dir"])
    total = sum((image.directory / n).stat().st_size for n in IMAGE_FILES)
    proc = shell.popen("cloudbox", "node", "local", "receive-image", iid, stdin=subprocess.PIPE)
    lines: list[tuple[float, str]] = []
    err = bytearray()

    def read_out() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.append((time.monotonic(), raw.decode(errors="replace").strip()))

    def read_err() -> None:
        assert proc.stderr is not None
        err.extend(proc.stderr.read())

    readers = [threading.Thread(target=f, daemon=True) for f in (read_out, read_err)]
    for t in readers:
        t.start()
    last = [0.0]

    def tick(n: int) -> None:
        if cancelled():
            raise CloudboxError("cancelled while copying the guest image")
        now = time.monotonic()
        if progress is not None and now - last[0] >= 0.5:
            last[0] = now
            progress(n, total)

    start = time.monotonic()
    assert proc.stdin is not None
    try:
        with tarfile.open(fileobj=_Counting(proc.stdin, tick), mode="w|", format=tarfile.PAX_FORMAT) as tar:
            body = "".join(f"{sums[n]}  {n}\n" for n in IMAGE_FILES).encode()
            info = tarfile.TarInfo(SUMS)
            info.size, info.mtime, info.mode = len(body), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(body))
            for name in IMAGE_FILES:
                tar.add(str(image.directory / name), arcname=name, recursive=False)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # the node stopped reading: its exit status and stderr say why
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    rc = proc.wait(timeout=600)
    for t in readers:
        t.join(10)
    if rc != 0:
        raise NodeError(f"{shell.where}: copying the guest image failed: {explain(rc, bytes(err))}")
    if progress is not None:
        progress(total, total)
    got = {text.split()[0]: (t, text) for t, text in lines if text}
    if "received" not in got or "verified" not in got:
        raise NodeError(f"{shell.where}: receive-image ended without confirming the copy (got {lines!r})")
    t_recv, t_ver = got["received"][0], got["verified"][0]
    seconds = max(t_recv - start, 1e-6)
    remote_dir = got["verified"][1].split(maxsplit=1)[1] if len(got["verified"][1].split()) > 1 else ""
    return Propagation(shell.node.name, iid, total, round(seconds, 3), round(t_ver - t_recv, 3),
                       round(total / seconds / 1e6, 2), False, remote_dir)


# The node's side (`cloudbox node local has-image|receive-image`).
def images_dir() -> Path:
    return paths.state_dir() / "images"


def local_has_image(iid: str) -> dict[str, Any]:
    d = images_dir() / _check_id(iid)
    ok = (d / ".complete").is_file() and _verify(d) is None
    return {"present": ok, "dir": str(d)}


def local_receive_image(iid: str, stream: IO[bytes], say: Callable[[str], None]) -> Path:
    """Unpack a tar of the image files from `stream` into images/<iid>, check the SHA-256 sums, rename into place
    (a failed copy leaves nothing behind). Prints 'received' and 'verified DIR' lines as it goes."""
    d = images_dir() / _check_id(iid)
    part = d.with_name(d.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                if member.name not in (*IMAGE_FILES, SUMS) or not member.isfile():
                    raise CloudboxError(f"receive-image: unexpected entry {member.name!r} in the stream; allowed: "
                                        f"{', '.join((*IMAGE_FILES, SUMS))}")
                # Only plain files with the names above get here; the data filter (Python >= 3.12) on top.
                if hasattr(tarfile, "data_filter"):
                    tar.extract(member, part, filter="data")
                else:
                    tar.extract(member, part)
        say("received")
        problem = _verify(part)
        if problem:
            raise CloudboxError(f"receive-image: {problem}")
        shutil.rmtree(d, ignore_errors=True)
        part.rename(d)
        (d / ".complete").touch()
    except BaseException:
        shutil.rmtree(part, ignore_errors=True)
        raise
    _prune(keep=d)
    say(f"verified {d}")
    return d


def _check_id(iid: str) -> str:
    if len(iid) != 16 or any(c not in "0123456789abcdef" for c in iid):
        raise CloudboxError(f"image id {iid!r}: allowed: 16 lowercase hex digits")
    return iid


def _verify(d: Path) -> str | None:
    """None when every file listed in SHA256SUMS is there with that hash; else what is wrong."""
    try:
        want: dict[str, str] = {}
        for line in (d / SUMS).read_text().splitlines():
            if line.strip():
                digest, name = line.split(None, 1)
                want[name.strip()] = digest
    except (OSError, ValueError) as e:
        return f"{d / SUMS}: {e}"
    for name in IMAGE_FILES:
        if name not in want:
            return f"{d / SUMS} lists no {name}"
        try:
            got = sha256_file(d / name)
        except OSError as e:
            return f"{d / name}: {e.strerror or e}"
        if got != want[name]:
            return f"{d / name}: SHA-256 mismatch (the copy is damaged)"
    return None


def local_images(clear: bool = False, keep: int = 0) -> dict[str, Any]:
    """The node's image cache, newest first ({"images": [{id, bytes, at, complete}], "removed": [ids]}); with
    clear, everything but the newest `keep` complete images goes (and any cut copy). Refused while a run is
    going on this node: its guest may be about to boot from the cache."""
    if keep < 0:
        raise CloudboxError(f"--keep {keep}: allowed: 0 or more")
    d = images_dir()
    entries = sorted((p for p in d.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime,
                     reverse=True) if d.is_dir() else []
    removed: list[str] = []
    if clear and entries:
        from ..runlock import check_not_busy

        check_not_busy()
        complete = [p for p in entries if not p.name.endswith(".part") and (p / ".complete").is_file()]
        for p in entries:
            if p not in complete[:keep]:
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p.name)
        entries = [p for p in entries if p.name not in removed]
    images = [{"id": p.name, "bytes": sum(f.stat().st_size for f in p.iterdir() if f.is_file()),
               "at": p.stat().st_mtime, "complete": (p / ".complete").is_file()} for p in entries]
    return {"dir": str(d), "images": images, "removed": removed}


def node_images(shell: NodeShell, *, clear: bool = False, keep: int = 0) -> dict[str, Any]:
    """`local_images` on the node, over the pinned SSH."""
    args = ["cloudbox", "node", "local", "images", *(["--clear", "--keep", str(keep)] if clear else [])]
    out = shell.run(*args, timeout=120, what="listing the image cache")
    try:
        return dict(json.loads(out.strip().splitlines()[-1]))
    except (ValueError, IndexError, TypeError):
        raise NodeError(f"{shell.where}: the image cache listing was {out.strip()[:200]!r}, not JSON") from None


def _prune(keep: Path) -> None:
    done = sorted((p for p in images_dir().iterdir() if p.is_dir() and not p.name.endswith(".part")),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    for old in [p for p in done if p != keep][KEEP_IMAGES - 1:]:
        shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------------------------- runs
def start_run(shell: NodeShell, spec: dict[str, Any], profile_toml: str, image_dir: str) -> RemoteRun:
    """Start a detached run on the node with this spec (its `profile` replaced by the front-end's resolved
    profile, sent along, so both ends run the same profile with the same hash) and the propagated image."""
    req = json.dumps({"spec": spec, "profile_toml": profile_toml, "image_dir": image_dir}).encode()
    out = shell.run("cloudbox", "node", "local", "start-run", input=req, timeout=120, what="starting the run")
    try:
        data = json.loads(out.strip().splitlines()[-1])
        return RemoteRun(shell.node.name, int(data["run_id"]), str(data.get("uuid", "")))
    except (ValueError, KeyError, IndexError):
        raise NodeError(f"{shell.where}: start-run answered {out.strip()[:200]!r}, not a run id") from None


def follow(shell: NodeShell, rr: RemoteRun, *, cancelled: Callable[[], bool] = lambda: False,
           after_seq: int = 0) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(seq, kind, payload) of the node's run as they happen, until it ends. Raises NodeError when the connection
    is lost (ssh ends without the run's final state)."""
    proc = shell.popen("cloudbox", "node", "local", "follow", str(rr.run_id), "--after", str(after_seq),
                       patient=True)
    assert proc.stdout is not None and proc.stderr is not None
    ended = False
    try:
        for raw in proc.stdout:
            if cancelled():
                break
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            seq, kind, payload = int(ev.get("seq", 0)), str(ev.get("kind", "")), ev.get("payload") or {}
            if kind == "state" and payload.get("state") not in (None, "running"):
                ended = True
            yield seq, kind, payload
    finally:
        if proc.poll() is None:
            proc.kill()
        rc = proc.wait()
    if not ended and not cancelled():
        raise NodeError(f"{shell.where}: lost the run's event stream before it ended "
                        f"({explain(rc, proc.stderr.read())}); run {rr.run_id} there may still be going")


def fetch_run(shell: NodeShell, rr: RemoteRun) -> dict[str, Any]:
    out = shell.run("cloudbox", "results", "export", "--format", "json", "--raw", str(rr.run_id), timeout=180,
                    what=f"reading run {rr.run_id}", patient=True)
    try:
        run: dict[str, Any] = json.loads(out)["runs"][0]
        return run
    except (ValueError, IndexError, KeyError, TypeError):
        raise NodeError(f"{shell.where}: run {rr.run_id}'s export is not JSON: {out[:200]!r}") from None


def cancel_run(shell: NodeShell, rr: RemoteRun) -> str:
    """Stop the node's run (guest destroyed, stores removed there); its state afterwards."""
    return shell.run("cloudbox", "cancel", str(rr.run_id), timeout=120, what=f"cancelling run {rr.run_id}",
                     patient=True).strip()


# The node's side of start-run and follow (`cloudbox node local start-run|follow`).
def local_start_run(req: dict[str, Any]) -> dict[str, Any]:
    """Start a detached run here from a front-end's request: {"spec": RunSpec fields, "profile_toml": the
    resolved profile, "image_dir": where propagation put the guest image}."""
    import dataclasses
    import os
    import tomllib

    from ..results import ResultStore
    from ..runner import start_detached
    from ..runspec import RunSpec

    try:
        spec_in = dict(req["spec"])
        profile_toml = str(req["profile_toml"])
        name = str(tomllib.loads(profile_toml)["name"])
    except (KeyError, TypeError, ValueError) as e:
        raise CloudboxError(f"start-run: the request is not what this cloudbox understands ({e}); allowed: JSON "
                            "with spec, profile_toml, image_dir (is the front-end's cloudbox the same version?)") \
            from None
    known = {f.name for f in dataclasses.fields(RunSpec)}
    unknown = sorted(set(spec_in) - known)
    if unknown:
        raise CloudboxError(f"start-run: unknown run setting(s) {', '.join(unknown)} from the front-end; allowed: "
                            f"{', '.join(sorted(known))} (update this node's cloudbox)")
    digest = hashlib.sha256(profile_toml.encode()).hexdigest()[:12]
    pdir = paths.state_dir() / "remote-profiles" / digest
    pdir.mkdir(parents=True, exist_ok=True)
    pfile = pdir / f"{Path(name).name}.toml"
    pfile.write_text(profile_toml)
    spec_in.update(profile=str(pfile), node="")
    image_dir = req.get("image_dir")
    if image_dir:
        GuestImage.locate(Path(image_dir))  # a clear error now rather than in the detached executor
        os.environ["CLOUDBOX_GUEST_IMAGE"] = str(image_dir)  # inherited by the detached executor
    spec = RunSpec(**spec_in)
    with ResultStore() as store:
        rid = start_detached(spec, store)
        return {"run_id": rid, "uuid": store.get_run(rid).uuid}


def local_follow(run_ref: str, after_seq: int, out: IO[str], poll: float = 0.3) -> int:
    """Print the run's events as JSON lines ({"seq", "kind", "payload"}) until it has ended; 0 when completed."""
    from ..results import ResultStore

    with ResultStore() as store:
        rid = store.resolve(run_ref)
        for ev in store.follow(rid, after_seq, poll=poll):
            out.write(json.dumps({"seq": ev.seq, "t": ev.t, "kind": ev.kind, "payload": ev.payload}) + "\n")
            out.flush()
        return 0 if store.get_run(rid, raw=False).state == "completed" else 1
