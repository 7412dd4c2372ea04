"""The front-end's side of work on an enrolled node, over the pinned SSH (the same OpenSSH, keys and pins as
libvirt's qemu+ssh transport): propagate the benchmark guest image from the front-end's store to the node, start a
run there, follow its events live, cancel it, fetch its result, list the node's image cache.

The node does the work with its own cloudbox: `cloudbox node local OP` (cli/node.py over agent.agent), run through
SSH by the front-end's management key, is the node's side of each step. Nothing listens on the node for this: it
is a command over SSH, like virt-ssh-helper for libvirt. The node's run is its own executor, started detached there
so a dropped connection cannot leave a half-cleaned guest; the front-end mirrors it (core.run.mirror). What a
node sends is read with a size limit: a node that sends more is an error naming it and the limit.

Image propagation is study B's measurement: the kernel, initramfs and manifest travel as one tar stream; the
node unpacks it into <its state dir>/images/<image id>.part, checks every file's SHA-256 and renames the
directory into place. Transfer time is taken on the front-end from the first byte sent to the node's "received"
line, so it includes writing the files on the node; the check is timed apart.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import CloudboxError
from ..record.provenance import Propagation, RemoteRun
from ..virt.guestimage import GuestImage
from .protocol import IMAGE_FILES, SUMS, StartRun
from .registry import NodeRecord, Registry

CHUNK = 1024 * 1024
PATIENT_CONNECT_S = 30  # ssh ConnectTimeout for a run's own traffic
PATIENT_KEEPALIVE_COUNT = 24  # x the registry's 5 s ServerAliveInterval: 2 min of silence before the stream drops
REATTACH_PAUSE_S = 10.0  # between attempts to re-attach a dropped event stream
REATTACH_WITHIN_S = 300.0  # a run's dropped event stream is re-attached for this long before the node counts as lost
OUTPUT_LIMIT = 1024 * 1024  # what a node's command may print (its answers are one JSON line)
RUN_EXPORT_LIMIT = 64 * 1024 * 1024  # a run's export with its raw tool output (a full study run: about 1 MB)
EVENT_LINE_LIMIT = 1024 * 1024  # one event of a followed run
STDERR_TAIL = 64 * 1024  # of a failed command's stderr, for its message


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
        base = list(self.base)
        if patient:
            at = base.index("--") if "--" in base else len(base) - 1
            base[at:at] = ["-o", f"ConnectTimeout={PATIENT_CONNECT_S}",
                           "-o", f"ServerAliveCountMax={PATIENT_KEEPALIVE_COUNT}"]
        return [*base, shlex.join(cmd)]

    def run(self, *cmd: str, input: bytes | None = None, timeout: float = 60.0, what: str = "",
            patient: bool = False, limit: int = OUTPUT_LIMIT) -> str:
        """The command's output; a NodeError when it fails, takes longer than `timeout` or prints more than
        `limit` bytes (it is stopped then: a node cannot fill the front-end's memory)."""
        what = what or " ".join(cmd[:3])
        with tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(self.argv(*cmd, patient=patient), stdout=subprocess.PIPE, stderr=err,
                                        stdin=subprocess.DEVNULL if input is None else subprocess.PIPE)
            except OSError as e:
                raise NodeError(f"{self.where}: cannot run ssh: {e}") from None
            out, over = _bounded(proc, input, limit)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                over.join(timeout=1.0)  # a child it left may hold its stdout: not waited for
                raise NodeError(f"{self.where}: {what} did not finish within {timeout:g} s") from None
            over.join()
            if over.exceeded:
                raise NodeError(f"{self.where}: {what} sent more than {_size(limit)}, the limit; stopped")
            if proc.returncode != 0:
                err.seek(max(0, err.seek(0, io.SEEK_END) - STDERR_TAIL))
                raise NodeError(f"{self.where}: {what} failed: {explain(proc.returncode, err.read())}")
        return bytes(out).decode(errors="replace")

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


class _Reader(threading.Thread):
    """Reads a process's stdout into `out` (writing `input` to its stdin first, beside it), stopping the process
    once more than `limit` bytes came."""

    def __init__(self, proc: subprocess.Popen[bytes], input: bytes | None, limit: int, out: bytearray) -> None:
        super().__init__(daemon=True)
        self.proc, self.input, self.limit, self.out = proc, input, limit, out
        self.exceeded = False

    def run(self) -> None:
        if self.input is not None and self.proc.stdin is not None:
            threading.Thread(target=self._write, daemon=True).start()
        assert self.proc.stdout is not None
        while chunk := os.read(self.proc.stdout.fileno(), CHUNK):
            self.out.extend(chunk)
            if len(self.out) > self.limit:
                self.exceeded = True
                self.proc.kill()
                break
        self.proc.stdout.close()

    def _write(self) -> None:
        assert self.proc.stdin is not None and self.input is not None
        try:
            self.proc.stdin.write(self.input)
            self.proc.stdin.close()
        except OSError:
            pass  # the command stopped reading: its exit status and stderr say why


def _bounded(proc: subprocess.Popen[bytes], input: bytes | None, limit: int) -> tuple[bytearray, _Reader]:
    out = bytearray()
    reader = _Reader(proc, input, limit, out)
    reader.start()
    return out, reader


def _size(n: int) -> str:
    return f"{n // 1024**2} MiB" if n >= 1024**2 else f"{n} bytes"


# ------------------------------------------------------------------------------------------ propagation
def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def file_sums(image: GuestImage) -> dict[str, str]:
    missing = [n for n in IMAGE_FILES if not (image.directory / n).is_file()]
    if missing:
        raise CloudboxError(f"the benchmark guest image in {image.directory} has no {', '.join(missing)}: it is older "
                            "than this cloudbox; rebuild it with 'make guest-image' "
                            "(appliance/guest/build-guest-image)")
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


def node_images(shell: NodeShell, *, clear: bool = False, keep: int = 0) -> dict[str, Any]:
    """`local_images` on the node, over the pinned SSH."""
    args = ["cloudbox", "node", "local", "images", *(["--clear", "--keep", str(keep)] if clear else [])]
    out = shell.run(*args, timeout=120, what="listing the image cache")
    try:
        return dict(json.loads(out.strip().splitlines()[-1]))
    except (ValueError, IndexError, TypeError):
        raise NodeError(f"{shell.where}: the image cache listing was {out.strip()[:200]!r}, not JSON") from None


# ------------------------------------------------------------------------------------------------- runs
def start_run_request(spec: dict[str, Any], profile_toml: str, image_dir: str,
                      mix_tomls: Sequence[str] = ()) -> bytes:
    """The start-run request's bytes (protocol.StartRun), as the node's `cloudbox node local start-run` reads them on
    stdin (agent.requests, which checks them against the same schema)."""
    # mix_tomls only for a mixed run: an older node refuses the field it does not know. Not validated here: the
    # node's refusal names what is wrong.
    return StartRun.model_construct(spec=spec, profile_toml=profile_toml, image_dir=image_dir,
                                    mix_tomls=list(mix_tomls) if len(mix_tomls) > 1 else None).to_bytes()


def start_run(shell: NodeShell, spec: dict[str, Any], profile_toml: str, image_dir: str,
              mix_tomls: Sequence[str] = ()) -> RemoteRun:
    """Start a detached run on the node with this spec (its `profile` replaced by the front-end's resolved
    profile, sent along, so both ends run the same profile with the same hash) and the propagated image; a mixed
    run's profiles, in the order the node's guests take them, go as `mix_tomls`."""
    req = start_run_request(spec, profile_toml, image_dir, mix_tomls)
    out = shell.run("cloudbox", "node", "local", "start-run", input=req, timeout=120, what="starting the run")
    try:
        data = json.loads(out.strip().splitlines()[-1])
        return RemoteRun(shell.node.name, int(data["run_id"]), str(data.get("uuid", "")))
    except (ValueError, KeyError, IndexError):
        raise NodeError(f"{shell.where}: start-run answered {out.strip()[:200]!r}, not a run id") from None


def follow(shell: NodeShell, rr: RemoteRun, *, cancelled: Callable[[], bool] = lambda: False,
           after_seq: int = 0, line_limit: int = EVENT_LINE_LIMIT) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(seq, kind, payload) of the node's run as they happen, until it ends. Raises NodeError when the connection
    is lost (ssh ends without the run's final state), and a CloudboxError for an event longer than `line_limit`."""
    proc = shell.popen("cloudbox", "node", "local", "follow", str(rr.run_id), "--after", str(after_seq),
                       patient=True)
    assert proc.stdout is not None and proc.stderr is not None
    ended = False
    try:
        while raw := proc.stdout.readline(line_limit + 1):
            if len(raw) > line_limit:
                raise CloudboxError(f"{shell.where}: an event of run {rr.run_id} there is longer than "
                                    f"{_size(line_limit)}, the limit; stopped following it")
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
                        f"({explain(rc, proc.stderr.read(STDERR_TAIL))}); run {rr.run_id} there may still be going")


Event = tuple[int, str, dict[str, Any]]  # a node's run's event as follow() yields it: (seq, kind, payload)


def follow_through_drops(shell: NodeShell, rr: RemoteRun, *, cancelled: Callable[[], bool],
                         say: Callable[[str], None],
                         lost: Callable[[float, NodeError], CloudboxError]) -> Iterator[Event]:
    """follow(), the stream re-attached where it stopped when it drops (said through `say`) for REATTACH_WITHIN_S;
    then `lost(seconds without a stream, the last error)` is raised. Ends quietly once `cancelled()`."""
    seq, dropped_at = 0, None
    while True:
        try:
            for ev in follow(shell, rr, cancelled=cancelled, after_seq=seq):
                seq, dropped_at = ev[0], None  # where a re-attached stream picks up
                yield ev
            return
        except NodeError as e:
            if cancelled():
                return
            now = time.monotonic()
            dropped_at = dropped_at or now
            if now - dropped_at > REATTACH_WITHIN_S:
                raise lost(now - dropped_at, e) from None
            say(f"re-attaching to run {rr.run_id} on {shell.node.name} in {REATTACH_PAUSE_S:.0f} s ({e})")
            time.sleep(REATTACH_PAUSE_S)


def fetch_run(shell: NodeShell, rr: RemoteRun, limit: int = RUN_EXPORT_LIMIT) -> dict[str, Any]:
    """The node's run as its `results export` writes it (measurements with raw output, provenance), read up to
    `limit` bytes."""
    out = shell.run("cloudbox", "results", "export", "--format", "json", "--raw", str(rr.run_id), timeout=180,
                    what=f"reading run {rr.run_id}", patient=True, limit=limit)
    try:
        run: dict[str, Any] = json.loads(out)["runs"][0]
        return run
    except (ValueError, IndexError, KeyError, TypeError):
        raise NodeError(f"{shell.where}: run {rr.run_id}'s export is not JSON: {out[:200]!r}") from None


def cancel_run(shell: NodeShell, rr: RemoteRun) -> str:
    """Stop the node's run (guest destroyed, stores removed there); its state afterwards."""
    return shell.run("cloudbox", "cancel", str(rr.run_id), timeout=120, what=f"cancelling run {rr.run_id}",
                     patient=True).strip()


