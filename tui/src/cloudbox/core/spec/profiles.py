"""Tuning profiles as validated data.

A profile is a TOML file (profiles/*.toml for shipped presets, the state directory's
profiles/ for the user's own) holding every knob the studies varied: hypervisor, guest
size, disk bus, cache mode, AIO mode, iothreads, queues, backing store and format, NIC
model, vhost, queues and MTU. This module provides:

- the pydantic model `Profile` (a name, a description and the knobs' tables), strict and closed
  (unknown keys and str->int coercion are errors);
- `parse_profile` / `load_profile`, which turn any problem (TOML syntax, a wrong type, a
  value out of range, an impossible combination of knobs) into a `ProfileError` with one
  `ProfileProblem` per problem, each naming the dotted key, the value and what is allowed;
- lookup (`find_profile`, `resolve_profile`, `resolve_mix`, `list_profiles`), comparison
  (`diff_profiles`, `mix_problem`), persistence (`save_user_profile`) and canonical forms
  (`Profile.hash`, `Profile.to_toml()`, `Profile.knobs()`, `Profile.describe()`).

The knobs themselves (their values, their tables, the rules between them and the decisions behind those) are
core.spec.knobs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from cloudbox.core import inputs, paths
from cloudbox.core.errors import NotFound, ProfileError, ProfileProblem, UsageError

from . import schema
from .iopaths import VIRTIOFS_CACHE, Placement, path_problems
from .knobs import (
    CHUNK_KIB,
    DOM0_MIN_MIB,
    RAID_CHUNK_DEFAULT_KIB,
    VOLUME_SCHEMES,
    Disk,
    Dom0,
    Guest,
    Network,
    Nfs,
    cross_field_problems,
    guest_type,
    implied_xen_type,
    is_nfs,
    volume_targets,
    xen_backend,
)
from .schema import CrossFieldProblems, NoControls, OneLine, Strict

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
# Knobs added after profiles were first hashed, with the value that leaves a profile's hash as it was.
_HASH_NEUTRAL: dict[str, dict[str, object]] = {"guest": {"xen_type": "auto"},
                                                "disk": {"count": 1, "raid": "none", "chunk_kib": 0, "attach": "host",
                                                         "xen_backend": "auto", "raid_on": "guest"},
                                                "dom0": {"vcpu_pin": "", "memory_mib": 0},
                                                "network": {"attach": "bridge"}}
SECTIONS: tuple[str, ...] = ("guest", "disk", "network", "dom0", "nfs", "placement")

# Human wording for string fields whose rule is not a list of values or a range.
_TEXT_RULES: dict[str, str] = {
    "name": "lowercase letters, digits and '-', starting with a letter or digit, at most 63 characters",
    "description": "one line of text, 1..200 characters",
    "reproduces": "one line of text, at most 200 characters",
    "disk.raid": 'none, "0" (a string: RAID 0 in the guest over the disk.count disks)',
    "disk.volume": (
        "empty; for backing = block-device an absolute /dev/ path; for backing = network-volume "
        + volume_targets(VOLUME_SCHEMES)
    ),
    "dom0.vcpu_pin": "empty (leave dom0's vCPUs as they are) or physical CPUs as a list, e.g. 0, 0-1, 0,2",
    "dom0.memory_mib": f"0 (leave dom0's memory as it is) or {DOM0_MIN_MIB}..262144 (MiB)",
    "disk.chunk_kib": (
        f"0 (no RAID) or, with disk.raid = 0, a power of two {CHUNK_KIB[0]}..{CHUNK_KIB[1]} (KiB; left out or 0: "
        f"mdadm's "
        f"{RAID_CHUNK_DEFAULT_KIB})"
    ),
    "placement.vcpu_pin": ("empty (the vCPUs float over every host CPU), auto (each vCPU on a CPU of its own of one "
                           "NUMA node, chosen at run time) or host CPUs as a list, one per vCPU in order, e.g. 0-1"),
    "placement.emulator_pin": ("empty (QEMU's own threads float), auto (the vCPUs' NUMA node's CPUs the vCPUs do not "
                               "take, else that whole node) or host CPUs as a list, e.g. 0, 0-1, 0,2"),
    "placement.iothread_pin": ("empty (the iothreads float), auto (as emulator_pin) or host CPUs as a list, e.g. 1; "
                               "needs disk.iothreads > 0"),
    "placement.memory_nodes": ("empty (the kernel places the RAM), auto (the NUMA node the vCPUs are pinned to) or "
                               "host NUMA nodes as a list, e.g. 0, 0-1"),
    "nfs.rsize_kib": f"0 (what client and server agree) or a power of two {CHUNK_KIB[0]}..{CHUNK_KIB[1]} (KiB)",
    "nfs.wsize_kib": f"0 (what client and server agree) or a power of two {CHUNK_KIB[0]}..{CHUNK_KIB[1]} (KiB)",
}


class Profile(Strict):
    """A complete, validated tuning profile. Construct with parse_profile/load_profile."""

    name: str = Field(pattern=NAME_PATTERN)
    description: OneLine
    reproduces: Annotated[str, Field(max_length=200, pattern=r"^[^\n\r]*$"), NoControls] | None = None
    guest: Guest
    disk: Disk
    network: Network
    dom0: Dom0 = Dom0()
    nfs: Nfs = Nfs()
    placement: Placement = Placement()

    @model_validator(mode="after")
    def _cross_checks(self) -> Profile:
        problems = cross_field_problems(self) + path_problems(self)
        if problems:
            raise CrossFieldProblems(problems)
        return self

    # -- canonical forms -------------------------------------------------------------

    def canonical_json(self) -> str:
        """Sorted-key, compact JSON of the whole validated model (what `hash` digests). Knobs added later are left
        out at their neutral value, so a profile that does not use them keeps the hash its stored runs carry."""
        data = self.model_dump(mode="json")
        for section, neutral in _HASH_NEUTRAL.items():
            for key, value in neutral.items():
                if data[section].get(key) == value:
                    del data[section][key]
        if data["guest"].get("xen_type") == implied_xen_type(self.disk.bus):
            del data["guest"]["xen_type"]  # the type the bus implies: the same guest as "auto"
        if not data["dom0"]:
            del data["dom0"]
        if not is_nfs(self.disk):
            del data["nfs"]  # a profile without an NFS export keeps the hash it had before [nfs] existed
        if self.placement == Placement():
            del data["placement"]  # nor one placed as the host's scheduler pleases the hash it had before it
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @property
    def hash(self) -> str:
        """sha256 (hex) of canonical_json(): equal profiles hash equal, whatever the file's layout."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def sections(self) -> tuple[str, ...]:
        """The profile's tables: [dom0] only for Xen, [nfs] only with an NFS export (or when set, which validation
        then refuses), [placement] only when set."""
        out = list(SECTIONS[:3])
        if self.guest.hypervisor == "xen" or self.dom0 != Dom0():
            out.append("dom0")
        if is_nfs(self.disk) or self.nfs != Nfs():
            out.append("nfs")
        if self.placement != Placement():
            out.append("placement")
        return tuple(out)

    def _fields(self, section: str, every: bool = False) -> list[str]:
        """The keys of a table shown for this profile: Xen's guest type only for Xen (or when set), unless `every`."""
        fields = list(type(getattr(self, section)).model_fields)
        if not every and section == "guest" and self.guest.hypervisor != "xen" and self.guest.xen_type == "auto":
            fields.remove("xen_type")
        return fields

    def knobs(self, every: bool = False, sections: tuple[str, ...] | None = None) -> dict[str, object]:
        """The tuning knobs as a flat, ordered dict: "guest.hypervisor" ... "network.mtu" (and "guest.xen_type",
        "dom0.*" for Xen, "nfs.*" with an NFS export, or with `every`); `sections` names the tables instead."""
        out: dict[str, object] = {}
        for section in sections or (SECTIONS if every else self.sections()):
            sub: BaseModel = getattr(self, section)
            for field in self._fields(section, every):
                out[f"{section}.{field}"] = getattr(sub, field)
        return out

    def to_toml(self) -> str:
        """Canonical TOML text: every key, in schema order; parse_profile() gives back an equal profile."""
        lines = [f"name = {toml_value(self.name)}", f"description = {toml_value(self.description)}"]
        if self.reproduces is not None:
            lines.append(f"reproduces = {toml_value(self.reproduces)}")
        for section in self.sections():
            sub: BaseModel = getattr(self, section)
            lines += ["", f"[{section}]"]
            for field in self._fields(section):
                lines.append(f"{field} = {toml_value(getattr(sub, field))}")
        return "\n".join(lines) + "\n"

    def describe(self) -> str:
        """One line for humans, e.g. "KVM, 1 vCPU, 1024 MiB; disk: emulated LSI SCSI on a sparse file ..."."""
        g, d, n = self.guest, self.disk, self.network
        disk = f"{_BUS_WORDS[d.bus]} on {_BACKING_WORDS[d.backing]} ({d.format})"
        if d.volume:
            disk += f" {d.volume}"
        if d.backing == "network-volume":
            disk += f" attached by {_ATTACH_WORDS[d.attach]}"
        if g.hypervisor == "xen":
            disk += f", backend {_XEN_BACKEND_WORDS[xen_backend(d)]}"
        disk += (f", cache={d.cache}, io={d.io}" if d.backing not in ("nvme-pci", "virtiofs") else
                 ", no host I/O path" if d.backing == "nvme-pci" else f", virtiofsd cache {VIRTIOFS_CACHE[d.cache]}")
        if d.backing == "virtiofs":  # a file system the guest mounts: no disk bus
            disk = f"{_BACKING_WORDS[d.backing]} (virtiofs), virtiofsd cache {VIRTIOFS_CACHE[d.cache]}"
        if d.iothreads:
            disk += f", {d.iothreads} iothread{'s' if d.iothreads > 1 else ''}"
        if d.queues > 1:
            disk += f", {d.queues} queues"
        if d.raid == "0" and d.raid_on == "host":
            disk = f"{disk}, on the host's RAID 0 ({d.chunk_kib} KiB chunks) over {d.count} loop devices"
        elif d.raid == "0":
            disk = f"RAID 0 ({d.chunk_kib} KiB chunks) over {d.count} disks, each {disk}"
        if is_nfs(d):  # a file system the guest mounts: no disk bus, cache or AIO mode of QEMU's
            f = self.nfs
            sizes = "".join(f", {k} {v} KiB" for k, v in (("rsize", f.rsize_kib), ("wsize", f.wsize_kib)) if v)
            disk = (f"NFSv{f.vers} export {d.volume.partition(':')[2]} mounted by {_ATTACH_WORDS[d.attach]} over "
                    f"{f.proto} ({f.writes}, nconnect {f.nconnect}{sizes})")
        net = _NIC_WORDS[n.model]
        if n.model == "virtio":
            net += " (vhost)" if n.vhost else " (userspace)"
        if n.queues > 1:
            net += f", {n.queues} queues"
        if n.attach == "macvtap":
            net += ", macvtap"
        net += f", MTU {n.mtu}"
        vcpu = f"{g.vcpus} vCPU{'s' if g.vcpus > 1 else ''}"
        dom0 = [f"vCPUs pinned to {self.dom0.vcpu_pin}"] if self.dom0.vcpu_pin else []
        dom0 += [f"{self.dom0.memory_mib} MiB"] if self.dom0.memory_mib else []
        more = f"; dom0: {', '.join(dom0)}" if dom0 else ""
        if self.placement != Placement():
            more += f"; placement: {placement_words(self.placement)}"
        hv = g.hypervisor.upper() + (f" {g.xen_type.upper()}" if g.xen_type != "auto" else "")
        return f"{hv}, {vcpu}, {g.memory_mib} MiB; disk: {disk}; net: {net}{more}"


def placement_words(p: Placement) -> str:
    """A [placement] table in words: "vCPUs pinned (auto), RAM strict on node auto, 2M huge pages"."""
    out = [f"{what} pinned ({pin})" for what, pin in (("vCPUs", p.vcpu_pin), ("emulator", p.emulator_pin),
                                                     ("iothreads", p.iothread_pin)) if pin]
    if p.memory_nodes:
        out.append(f"RAM {p.memory_mode} on node {p.memory_nodes}")
    if p.hugepages != "none":
        out.append(f"{p.hugepages} huge pages")
    if p.guest_nodes > 1:
        out.append(f"{p.guest_nodes} guest NUMA nodes")
    return ", ".join(out) or "as the host's scheduler places it"


_BUS_WORDS = {
    "virtio-blk": "virtio-blk",
    "virtio-scsi": "virtio-scsi",
    "scsi-lsi": "emulated LSI SCSI",
    "sata": "emulated SATA (AHCI)",
    "ide": "emulated IDE",
    "xen-vbd": "Xen PV block (xvd)",
    "nvme": "NVMe",
}
_BACKING_WORDS = {
    "sparse-file": "a sparse file",
    "prealloc-file": "a pre-allocated file",
    "qcow2": "a qcow2 image",
    "qcow2-prealloc": "a pre-allocated qcow2 image",
    "block-device": "a whole block device",
    "network-volume": "a network volume",
    "vhost-user": "a pre-allocated file served by qemu-storage-daemon (vhost-user-blk)",
    "nvme-pci": "the host's own NVMe controller (VFIO, named with --device)",
    "virtiofs": "a directory of the host shared by virtiofsd",
}
_ATTACH_WORDS = {"host": "the host's kernel", "guest": "the guest's kernel", "qemu": "QEMU's own initiator"}
_XEN_BACKEND_WORDS = {"phy": "blkback (phy)", "qdisk": "qdisk (QEMU in dom0)"}
_NIC_WORDS = {"e1000": "e1000", "rtl8139": "rtl8139", "virtio": "virtio-net", "xen-netfront": "Xen netfront",
              "vf": "a virtual function of the host's SR-IOV NIC"}


def xen_guest_type(profile: Profile) -> str:
    """How Xen runs the profile's guest: "pv", "pvh" or "hvm" (guest.xen_type, "auto" resolved from the bus);
    "" for a KVM profile."""
    return guest_type(profile.guest, profile.disk)


# -- TOML output ---------------------------------------------------------------------


def toml_value(v: object) -> str:
    """A bool, int or string as a TOML value; a TypeError for any other."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        # JSON string escapes are valid TOML basic-string escapes (no surrogate pairs: ensure_ascii off).
        # DEL is the one control character JSON leaves raw and TOML forbids.
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    raise TypeError(f"no TOML form for {type(v).__name__}")


# -- pydantic errors -> ProfileProblem -------------------------------------------------


def allowed_for(key: str) -> str | None:
    """What a key accepts, spelled out: "none, writethrough, ..." or "1..64" or a rule in words."""
    if key in _TEXT_RULES:
        return _TEXT_RULES[key]
    parts = key.split(".")
    model = schema.model_at(Profile, parts)
    if model is None or parts[-1] not in model.model_fields:
        return None
    return schema.field_allowed(model, parts[-1], key)


def knob_kind(key: str) -> tuple[str, list[str]]:
    """How a form should ask for knob `key` ("disk.cache"): ("choice", values) for a fixed set,
    ("bool", ["true", "false"]), ("int", []) or ("str", [])."""
    parts = key.split(".")
    model = schema.model_at(Profile, parts)
    if model is None or parts[-1] not in model.model_fields:
        raise KeyError(key)
    ann = model.model_fields[parts[-1]].annotation
    if typing.get_origin(ann) is Literal:
        return "choice", [str(a) for a in typing.get_args(ann)]
    if ann is bool:
        return "bool", ["true", "false"]
    if ann is int:
        return "int", []
    return "str", []


def _key(loc: schema.Loc) -> str:
    return inputs.key_text(loc) or "(profile)"


def _allowed(loc: schema.Loc, key: str, etype: str) -> str | None:
    if etype == "extra_forbidden":
        owner = schema.model_at(Profile, [str(p) for p in loc])
        return f"known keys: {schema.keys_text(owner)}" if owner else None
    if key == "(profile)":
        return f"a TOML document with keys: {schema.keys_text(Profile)}"
    return allowed_for(key)


def _reword(key: str, err: dict[str, Any], message: str) -> str:
    return "must be one line of text" if err["type"] == "string_pattern_mismatch" and key == "description" else message


# -- parsing and loading ----------------------------------------------------------------

def validate_data(data: object, source: str, *, expect_name: str | None = None) -> Profile:
    """Validate already-parsed data (a dict) into a Profile, or raise ProfileError."""
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(source, schema.problems_from(exc, key=_key, allowed=_allowed, reword=_reword)) from None
    if expect_name is not None and profile.name != expect_name:
        raise ProfileError(
            source,
            [
                ProfileProblem(
                    "name",
                    profile.name,
                    "must equal the file name without .toml",
                    f"{expect_name} (this file is {expect_name}.toml)",
                )
            ],
        )
    return profile


def parse_profile(text: str, source: str = "<profile>", *, expect_name: str | None = None) -> Profile:
    """Parse TOML text into a Profile. `source` names the text in errors; `expect_name`, when
    given, is the name the profile must carry (load_profile passes the file's stem)."""
    return validate_data(schema.parse_toml(text, source, ProfileError), source, expect_name=expect_name)


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Load and validate one profile file (a regular file of at most inputs.MAX_FILE_BYTES); its `name` must
    equal the file's stem."""
    return schema.load_file(path, lambda text, source, stem: parse_profile(text, source, expect_name=stem),
                            error=ProfileError, missing=_missing, kept=_LOADED)


def _missing(path: str | os.PathLike[str]) -> NotFound:
    return NotFound(f"{inputs.shown(os.fspath(path))}: no such profile file")


_LOADED: schema.Parsed[Profile] = schema.Parsed(256)  # Profile is immutable


# -- lookup ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileEntry:
    """One profile file found on the profile path. `problem` is set (and `description`
    empty) when the file does not validate; the list still shows it."""

    name: str
    path: Path
    kind: Literal["preset", "user"]
    description: str
    problem: str | None = None
    hypervisor: str = ""  # guest.hypervisor of a valid profile: which boot of the box runs it
    xen_type: str = ""  # a valid Xen profile's guest type (pv, pvh, hvm): whether that Xen must have VT-x/AMD-V
    raid_on: str = "guest"  # a valid profile's disk.raid_on: a host RAID needs the host's md and mdadm


def _kind(directory: Path) -> Literal["preset", "user"]:
    presets = {d.resolve() for d in paths.preset_dirs()}
    return "preset" if directory.resolve() in presets else "user"


def _candidates() -> Iterable[tuple[str, Path]]:
    """(name, path) for every *.toml on the profile path, first directory first, shadowed names skipped."""
    seen: set[str] = set()
    for d in paths.profile_path():
        if not d.is_dir():
            continue
        for f in sorted(d.glob("*.toml")):
            if f.stem in seen or not f.is_file():
                continue
            seen.add(f.stem)
            yield f.stem, f


def list_profiles() -> list[ProfileEntry]:
    """Every profile on paths.profile_path(), sorted by name (presets and user profiles alike)."""
    out: list[ProfileEntry] = []
    for name, f in _candidates():
        try:
            prof = load_profile(f)
            out.append(ProfileEntry(name, f, _kind(f.parent), prof.description, hypervisor=prof.guest.hypervisor,
                                    xen_type=xen_guest_type(prof), raid_on=prof.disk.raid_on))
        except (ProfileError, NotFound) as exc:
            out.append(ProfileEntry(name, f, _kind(f.parent), "", str(exc)))
    return sorted(out, key=lambda e: e.name)


def find_profile_path(name: str) -> Path:
    """The file that defines profile `name` (first match on the profile path), or NotFound."""
    if re.fullmatch(NAME_PATTERN.strip("^$"), name):
        for d in paths.profile_path():
            f = d / f"{name}.toml"
            if f.is_file():
                return f
    known = sorted(n for n, _ in _candidates())
    raise NotFound(f"no profile named {inputs.shown(name)}{inputs.did_you_mean(name, known)}; known profiles: "
                   f"{', '.join(known) or '(none)'} (or a path to a .toml file)")


def find_profile(name: str) -> Profile:
    """Load the profile called `name` from the profile path (NotFound lists the known names)."""
    return load_profile(find_profile_path(name))


def resolve_profile(ref: str) -> Profile:
    """A profile by name, or by file when `ref` looks like a path (contains '/' or ends in .toml)."""
    if "/" in ref or ref.endswith(".toml"):
        return load_profile(ref)
    return find_profile(ref)


MIX = "+"  # joins the profiles of a mixed run, one per guest in turn: "virtio-file+kvm-cache-none"
# What a mixed run's profiles may differ in: each guest's own hardware. The rest (the backing store, the host's
# bridge and MTU, the hypervisor, an export's mount) is the run's, set up once for every guest.
GUEST_SIDE_KNOBS = ("guest.vcpus", "guest.memory_mib", "disk.bus", "disk.cache", "disk.io", "disk.iothreads",
                    "disk.queues", "network.model", "network.vhost", "network.queues")


def split_mix(ref: str) -> list[str]:
    """The profile references in `ref`: several joined by MIX, or one (a name, or a file even with MIX in its path).
    A file whose path holds MIX stays whole inside a list too: at each place the longest run of pieces that names
    an existing file is one reference."""
    if MIX not in ref or Path(ref).is_file():
        return [ref]
    pieces, out, i = ref.split(MIX), [], 0
    while i < len(pieces):
        j = next((j for j in range(len(pieces), i + 1, -1) if Path(MIX.join(pieces[i:j]).strip()).is_file()), i + 1)
        out.append(MIX.join(pieces[i:j]).strip())
        i = j
    return out


def resolve_mix(ref: str) -> list[Profile]:
    """The profiles of `ref`: one (a name or a file), or several joined by MIX for a mixed run of N guests."""
    parts = split_mix(ref)
    if not all(parts):
        raise UsageError(f"--profile {inputs.shown(ref)}: an empty name in the list; allowed: NAME or "
                         f"NAME{MIX}NAME[{MIX}...] (one profile per guest in turn)")
    return [resolve_profile(p) for p in parts]


def mix_problem(profiles: list[Profile], *, link_unused: bool = False) -> str | None:
    """Why these profiles cannot share one run (a knob outside GUEST_SIDE_KNOBS that differs, named with both
    values), else None. `link_unused`: the run sends nothing over the guests' NICs (storage tests on their own
    disks), so network.mtu may differ too."""
    free = (*GUEST_SIDE_KNOBS, "network.mtu") if link_unused else GUEST_SIDE_KNOBS
    first = profiles[0]
    for other in profiles[1:]:
        for key, a, b in diff_profiles(first, other):
            if key not in free:
                why = (" (the run's network tests, NFS mount or MPI job use the guests' link)"
                       if key == "network.mtu" else "")
                return (f"profiles {first.name} and {other.name} differ in {key} ({a!r} / {b!r}), which the run sets "
                        f"up once for every guest{why}; allowed to differ: {', '.join(free)}")
    return None


def mix_hash(profiles: list[Profile]) -> str:
    """One profile's hash, or for a mixed run the hash of its profiles' hashes in guest order."""
    if len(profiles) == 1:
        return profiles[0].hash
    return hashlib.sha256(MIX.join(p.hash for p in profiles).encode()).hexdigest()


def diff_profiles(a: Profile, b: Profile) -> list[tuple[str, object, object]]:
    """(key, a_value, b_value) for every tuning knob that differs, in schema order.
    Names and descriptions are not knobs and are not compared."""
    ka, kb = a.knobs(every=True), b.knobs(every=True)
    return [(k, ka[k], kb[k]) for k in ka if ka[k] != kb[k]]


def preset_names() -> list[str]:
    """Names of the shipped presets (profiles/*.toml in the preset directories)."""
    return sorted({f.stem for d in paths.preset_dirs() for f in d.glob("*.toml")})


def save_user_profile(profile: Profile) -> Path:
    """Validate `profile` and write it (canonical TOML) to the user profiles directory.
    Refuses a name used by a shipped preset; overwrites the user's own profile of that name."""
    source = f"user profile {profile.name!r}"
    validated = validate_data(profile.model_dump(), source)
    presets = preset_names()
    if validated.name in presets:
        raise ProfileError(
            source,
            [
                ProfileProblem(
                    "name",
                    validated.name,
                    "is the name of a shipped preset; presets cannot be overwritten",
                    "any valid name not used by a preset (presets: " + ", ".join(presets) + ")",
                )
            ],
        )
    d = paths.user_profiles_dir()
    d.mkdir(parents=True, exist_ok=True)
    target = d / f"{validated.name}.toml"
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    tmp.write_text(validated.to_toml(), encoding="utf-8")
    os.replace(tmp, target)
    return target


# -- the active profile -----------------------------------------------------------------

DEFAULT_ACTIVE = "virtio-disk"


def _active_file() -> Path:
    return paths.state_dir() / "active-profile"


def active_profile_name() -> str:
    """The profile new runs and guests use unless told otherwise (set with set_active_profile()).
    Falls back to DEFAULT_ACTIVE when none was chosen or the chosen one no longer exists."""
    try:
        name = _active_file().read_text().strip()
    except OSError:
        name = ""
    if name:
        try:
            find_profile_path(name)
            return name
        except NotFound:
            pass
    return DEFAULT_ACTIVE


def set_active_profile(name: str) -> Profile:
    """Make `name` the active profile; it must exist and validate (errors name the file and keys)."""
    prof = find_profile(name)
    f = _active_file()
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_name(f".{f.name}.tmp{os.getpid()}")
    tmp.write_text(prof.name + "\n")
    os.replace(tmp, f)
    return prof
