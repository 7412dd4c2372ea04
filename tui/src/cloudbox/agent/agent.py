"""The node's own side of a front-end's work on it: `cloudbox node local OP` (cli/node.py), run by the front-end over
the pinned SSH (core.cluster.client): the guest image cache (has-image, receive-image, images), runs (start-run,
follow, coord) and the credentials for the front-end's volumes (volume-creds). A run starts as any detached run here
(core.run.runs), with the front-end's resolved profile and the propagated image."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import IO, Any

from cloudbox.core import paths
from cloudbox.core.cluster.client import sha256_file
from cloudbox.core.cluster.protocol import COORD_LINE_LIMIT, IMAGE_FILES, SUMS
from cloudbox.core.disks.volumes import nodecreds
from cloudbox.core.errors import CloudboxError
from cloudbox.core.record.results import ResultStore
from cloudbox.core.record.runlock import check_not_busy
from cloudbox.core.run import hold
from cloudbox.core.run.runs import start_detached
from cloudbox.core.spec.profiles import MIX
from cloudbox.core.spec.runspec import RunSpec
from cloudbox.core.virt.guestimage import GuestImage

KEEP_IMAGES = 3  # image ids a node keeps in its cache (the newest)


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


def _prune(keep: Path) -> None:
    done = sorted((p for p in images_dir().iterdir() if p.is_dir() and not p.name.endswith(".part")),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    for old in [p for p in done if p != keep][KEEP_IMAGES - 1:]:
        shutil.rmtree(old, ignore_errors=True)


def _profile_file(profile_toml: str) -> Path:
    """A front-end's resolved profile written here (by its digest) for the run to load; ValueError if unreadable."""
    name = str(tomllib.loads(profile_toml)["name"])
    pdir = paths.state_dir() / "remote-profiles" / hashlib.sha256(profile_toml.encode()).hexdigest()[:12]
    pdir.mkdir(parents=True, exist_ok=True)
    pfile = pdir / f"{Path(name).name}.toml"
    pfile.write_text(profile_toml)
    return pfile


def local_start_run(req: dict[str, Any]) -> dict[str, Any]:
    """Start a detached run here from a front-end's request: {"spec": RunSpec fields, "profile_toml": the
    resolved profile, "image_dir": where propagation put the guest image, and for a mixed run "mix_tomls": its
    profiles in the order this node's guests take them}."""
    try:
        spec_in = dict(req["spec"])
        texts = [str(t) for t in req.get("mix_tomls") or [req["profile_toml"]]]
        files = [_profile_file(text) for text in texts]
    except (KeyError, TypeError, ValueError) as e:
        raise CloudboxError(f"start-run: the request is not what this cloudbox understands ({e}); allowed: JSON "
                            "with spec, profile_toml, image_dir (is the front-end's cloudbox the same version?)") \
            from None
    known = {f.name for f in fields(RunSpec)}
    unknown = sorted(set(spec_in) - known)
    if unknown:
        raise CloudboxError(f"start-run: unknown run setting(s) {', '.join(unknown)} from the front-end; allowed: "
                            f"{', '.join(sorted(known))} (update this node's cloudbox)")
    spec_in.update(profile=MIX.join(map(str, files)), node="")
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
    with ResultStore() as store:
        rid = store.resolve(run_ref)
        for ev in store.follow(rid, after_seq, poll=poll):
            out.write(json.dumps({"seq": ev.seq, "t": ev.t, "kind": ev.kind, "payload": ev.payload}) + "\n")
            out.flush()
        return 0 if store.get_run(rid, raw=False).state == "completed" else 1


def local_coord(inp: IO[str], out: IO[str]) -> int:
    """A spread run's front-end talking to this place's part for the length of the run, one line each way:
    `clock` -> this host's time (epoch seconds); `go RUN TEST AT` -> that test of run RUN starts at AT (this host's
    clock) -> `ok`, or `error: ...`."""
    while line := inp.readline(COORD_LINE_LIMIT):
        words = line.split()
        while len(line) == COORD_LINE_LIMIT and not line.endswith("\n"):  # an overlong line: dropped, unknown
            words, line = ["too-long"], inp.readline(COORD_LINE_LIMIT)
        try:
            if words == ["clock"]:
                out.write(f"{time.time():.6f}\n")
            elif len(words) == 4 and words[0] == "go":
                hold.release(int(words[1]), words[2], float(words[3]))
                out.write("ok\n")
            else:
                out.write("error: allowed: clock | go RUN TEST AT\n")
        except (CloudboxError, ValueError, OSError) as e:
            out.write(f"error: {e}\n".replace("\n", " ").rstrip() + "\n")
        out.flush()
    return 0


def local_volume_creds(data: Any) -> dict[str, Any]:
    """The front-end's volume credentials for this node (a JSON object read from standard input), installed; None
    (the request `null`) only reports the fingerprint of the set installed ('' for none)."""
    if data is None:
        return {"fingerprint": nodecreds.installed_fingerprint()}
    if not isinstance(data, dict):
        raise CloudboxError("volume-creds: the request is not a JSON object")
    return {"fingerprint": nodecreds.install(data).fingerprint}
