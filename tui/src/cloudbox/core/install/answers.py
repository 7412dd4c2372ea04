"""The install answer file: its schema, and the checks that it fits this machine.

An answer file is TOML (docs/install.md has the reference). Two layers of checks, both before anything is
written, both reporting every problem at once as an `AnswerError` whose entries name the key, the bad value
and what is allowed:

- `parse_answers` / `load_answers`: the file alone (pydantic, closed schema: an unknown key is an error;
  strict types; cross-field rules such as "a back-end needs network.frontend");
- `check_answers`: the file against a `Machine` snapshot: the target disk exists, is not the boot medium,
  has nothing mounted, is big enough, and when it holds data its serial is confirmed; the NICs exist and
  differ; a credential named for the root password exists. The result is a `Resolved` install: the
  answers plus the disk and NICs they name and the install id.

The install id (`install_id()`) is a UUID derived from the answers that change what is written (not
`after`): the installed disk's partition UUIDs are derived from it, which is how a re-run recognises a
disk it wrote itself (interrupted: resume; finished: nothing to do) without asking for a confirmation.
"""

from __future__ import annotations

import ipaddress
import json
import os
import posixpath
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field, ValidationError, field_validator, model_validator

from cloudbox.core import inputs
from cloudbox.core.errors import AnswerError, ProfileProblem
from cloudbox.core.install.disks import INSTALL_NAMESPACE, Disk, find_disk
from cloudbox.core.install.machine import Machine, Nic
from cloudbox.core.spec import schema
from cloudbox.core.spec.profiles import toml_value
from cloudbox.core.spec.schema import CrossFieldProblems, NoControls, Strict, no_controls

Role = Literal["front-end", "back-end", "all-in-one"]
ROLES: tuple[str, ...] = ("front-end", "back-end", "all-in-one")
After = Literal["reboot", "poweroff", "stay"]

HOSTNAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
NIC_PATTERN = r"^([A-Za-z0-9_.-]{1,15}|[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5})$"
CREDENTIAL_PATTERN = r"^[A-Za-z0-9_.@-]{1,255}$"
# crypt(5) hashes Debian's passwd/shadow understand: yescrypt, gost-yescrypt, scrypt, bcrypt, sha512, sha256.
PASSWORD_HASH_PATTERN = r"^\$(y|gy|7|2[abxy]|6|5)\$[^\s:]{8,}$"
SSH_KEY_PATTERN = (
    r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com|"
    r"sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]+={0,3}( [^\n\r]*)?$"
)

_TEXT_RULES: dict[str, str] = {
    "role": ", ".join(ROLES) + " (exactly one per node)",
    "hostname": "lowercase letters, digits and '-', 1..63 characters, not starting or ending with '-'",
    "disk.target": "an absolute, normalised /dev/disk/by-id/ path (see `cloudbox install disks`)",
    "disk.confirm_serial": "the target disk's serial number, as `cloudbox install disks` shows it (no control "
    "characters)",
    "network.private_nic": "a NIC name (e.g. enp1s0) or MAC address (see `ip link`)",
    "network.campus_nic": "a NIC name (e.g. enp2s0) or MAC address (see `ip link`)",
    "network.private_mtu": "an integer 1500..9000",
    "network.frontend": '"discover" or the front-end\'s IPv4/IPv6 address on the private network ('
    + inputs.FRONTEND_ADDRESS_RULE + ")",
    "network.private_address": "the front-end's private IPv4 address with prefix, in a private range "
    f"({inputs.PRIVATE_RANGES_TEXT}), prefix /8../27, e.g. 10.73.0.1/24 (the default)",
    "root.password_hash": "a crypt(5) hash: $y$... (yescrypt), $6$... (sha512), $5$..., $2b$...; "
    "make one with `openssl passwd -6` or `mkpasswd`",
    "root.password_credential": "the name of a systemd credential holding a password hash "
    "(e.g. passwd.hashed-password.root)",
    "root.ssh_authorized_keys": "a list of OpenSSH public keys, one line each (ssh-ed25519 AAAA... comment)",
    "after": "reboot, poweroff, stay",
}
_SECTION_KEYS = {
    "": "role, hostname, after, [disk], [network], [root]",
    "disk": "target, confirm_serial",
    "network": "private_nic, campus_nic, private_mtu, frontend, private_address",
    "root": "password_hash, password_credential, ssh_authorized_keys",
}


class DiskAnswers(Strict):
    target: Annotated[str, Field(min_length=1, max_length=4096), AfterValidator(inputs.checked_path)]
    confirm_serial: Annotated[str, Field(min_length=1, max_length=256), NoControls] | None = None


class NetworkAnswers(Strict):
    private_nic: str | None = Field(None, pattern=NIC_PATTERN)
    campus_nic: str | None = Field(None, pattern=NIC_PATTERN)
    private_mtu: int = Field(9000, ge=1500, le=9000)
    frontend: str | None = None
    # The front-end's address on the private network; it serves DHCP there (docs/cluster.md). None: the default.
    private_address: str | None = None

    @field_validator("private_address")
    @classmethod
    def _private_address(cls, v: str | None) -> str | None:
        if v is None:
            return v
        no_controls(v)
        if "/" not in v:
            raise ValueError("no prefix given: write the address with its prefix, A.B.C.D/NN")
        try:
            iface = ipaddress.IPv4Interface(v)
        except ValueError:
            raise ValueError("not an IPv4 address with a prefix (A.B.C.D/NN)") from None
        if not 8 <= iface.network.prefixlen <= 27:
            raise ValueError("the prefix must be /8../27 (room for the back-ends and their guests: DHCP hands out "
                             "addresses from the 16th on)")
        if not inputs.in_private_ranges(iface.ip):
            raise ValueError(f"not in a private range ({inputs.PRIVATE_RANGES_TEXT})")
        if iface.ip in (iface.network.network_address, iface.network.broadcast_address):
            raise ValueError("the network's own or broadcast address cannot be a host's")
        return str(iface)

    @field_validator("frontend")
    @classmethod
    def _frontend(cls, v: str | None) -> str | None:
        if v is None or v == "discover":
            return v
        try:
            addr = inputs.ip_address(v)
        except ValueError:
            raise ValueError("not an IP address and not \"discover\"") from None
        why = inputs.peer_address_problem(addr)
        if why:
            raise ValueError(f"{why} ({addr}) cannot be the front-end")
        return str(addr)


class RootAnswers(Strict):
    password_hash: Annotated[str, Field(pattern=PASSWORD_HASH_PATTERN), NoControls] | None = None
    password_credential: str | None = Field(None, pattern=CREDENTIAL_PATTERN)
    ssh_authorized_keys: list[str] = Field(default_factory=list, max_length=64)

    @field_validator("ssh_authorized_keys")
    @classmethod
    def _keys(cls, v: list[str]) -> list[str]:
        for i, key in enumerate(v):
            bad = inputs.control_chars(key.strip())
            if bad:
                raise ValueError(f"entry {i + 1} contains {bad}")
            if not re.fullmatch(SSH_KEY_PATTERN, key.strip()):
                raise ValueError(f"entry {i + 1} is not an OpenSSH public key line")
        return [k.strip() for k in v]


class Answers(Strict):
    """A complete, validated answer file (what one node's install needs)."""

    role: Role
    hostname: str = Field(pattern=HOSTNAME_PATTERN)
    disk: DiskAnswers
    network: NetworkAnswers = Field(default_factory=lambda: NetworkAnswers.model_validate({}))
    root: RootAnswers = Field(default_factory=lambda: RootAnswers.model_validate({}))
    after: After = "reboot"

    @model_validator(mode="after")
    def _cross(self) -> Answers:
        problems = cross_field_problems(self)
        if problems:
            raise CrossFieldProblems(problems)
        return self

    def canonical_json(self, *, for_id: bool = False) -> str:
        data = self.model_dump(mode="json")
        if for_id:
            data.pop("after", None)
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @property
    def install_id(self) -> str:
        return str(uuid.uuid5(INSTALL_NAMESPACE, self.canonical_json(for_id=True)))

    def to_toml(self) -> str:
        """The answers as an answer file (what an interactive install saves for a later unattended one)."""
        lines = [f"role = {_q(self.role)}", f"hostname = {_q(self.hostname)}", f"after = {_q(self.after)}"]
        for section in ("disk", "network", "root"):
            sub: BaseModel = getattr(self, section)
            lines += ["", f"[{section}]"]
            for name in type(sub).model_fields:
                v = getattr(sub, name)
                if v is None:
                    continue
                lines.append(f"{name} = {_q(v)}")
        return "\n".join(lines) + "\n"


def _q(v: object) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_q(x) for x in v) + "]"
    return toml_value(v if isinstance(v, (bool, int)) else str(v))


def cross_field_problems(a: Answers) -> list[ProfileProblem]:
    return _cross(a.role, a.network.model_dump(), a.root.model_dump())


def _cross(role: object, net: dict[str, Any], root: dict[str, Any]) -> list[ProfileProblem]:
    """Rules between keys, on plain values: also applied to a file whose keys are not all valid, so that every
    problem is reported at once (a value that is itself invalid is left to its own problem)."""
    out: list[ProfileProblem] = []
    frontend, private, campus = net.get("frontend"), net.get("private_nic"), net.get("campus_nic")
    if role == "back-end" and frontend is None:
        out.append(ProfileProblem("network.frontend", None, "a back-end must know its front-end",
                                  _TEXT_RULES["network.frontend"]))
    if role in ("front-end", "all-in-one") and frontend is not None:
        out.append(ProfileProblem("network.frontend", frontend,
                                  f"only a back-end has a front-end, not {inputs.a_or_an(role)}",
                                  f"no network.frontend (with role = {role})"))
    if role in ("front-end", "back-end") and private is None:
        out.append(ProfileProblem("network.private_nic", None,
                                  f"{inputs.a_or_an(role)} needs the NIC that faces the private network",
                                  _TEXT_RULES["network.private_nic"]))
    if role == "front-end" and campus is None:
        out.append(ProfileProblem("network.campus_nic", None,
                                  "a front-end needs the NIC that faces the campus network",
                                  _TEXT_RULES["network.campus_nic"]))
    if net.get("private_address") is not None and (role == "back-end" or private is None):
        out.append(ProfileProblem("network.private_address", net.get("private_address"),
                                  "only a front-end (or an all-in-one node with a private NIC) serves the "
                                  "private network" if role == "back-end" else
                                  "a private address needs network.private_nic",
                                  "no network.private_address on a back-end (it gets one from the front-end's "
                                  "DHCP)" if role == "back-end" else _TEXT_RULES["network.private_nic"]))
    if isinstance(private, str) and isinstance(campus, str) and private.lower() == campus.lower():
        out.append(ProfileProblem("network.campus_nic", campus,
                                  "the same NIC cannot face both the private and the campus network",
                                  f"a NIC other than network.private_nic ({private})"))
    if root.get("password_hash") is not None and root.get("password_credential") is not None:
        out.append(ProfileProblem("root.password_credential", root.get("password_credential"),
                                  "give the root password either as root.password_hash or as a credential, not both",
                                  "one of root.password_hash, root.password_credential"))
    return out


# ------------------------------------------------------------------------------------- pydantic -> problems
def _key(loc: schema.Loc) -> str:
    parts = tuple(str(x) for x in loc)
    if parts and parts[0] == "root" and len(parts) > 2 and parts[1] == "ssh_authorized_keys":
        parts = parts[:2]  # one entry of the list: report the list key
    return inputs.key_text(parts) or "(answers)"


def _allowed(loc: schema.Loc, key: str, etype: str) -> str | None:
    if etype == "extra_forbidden":
        section = str(loc[0]) if len(loc) == 2 else ""
        return f"known keys: {_SECTION_KEYS.get(section, '')}"
    if key == "(answers)":
        return f"a TOML document with keys: {_SECTION_KEYS['']}"
    if key in ("disk", "network", "root"):
        return f"a [{key}] table with keys: {_SECTION_KEYS[key]}"
    return _TEXT_RULES.get(key)


def _reword(key: str, err: dict[str, Any], message: str) -> str:
    return "a node has exactly one role" if key == "role" and isinstance(err.get("input"), list) else message


def validate_data(data: object, source: str) -> Answers:
    try:
        return Answers.model_validate(data)
    except ValidationError as exc:
        problems = schema.problems_from(exc, key=_key, allowed=_allowed, reword=_reword)
        if isinstance(data, dict):  # the rules between keys, on what is there (pydantic skips them on errors)
            net, root = data.get("network"), data.get("root")
            seen = {p.key for p in problems}
            # A section that is not a table has its own problem; rules about its keys would be false ones.
            broken = {k for k in ("network", "root") if k in data and not isinstance(data[k], dict)}
            extra = _cross(data.get("role"), net if isinstance(net, dict) else {},
                           root if isinstance(root, dict) else {})
            problems += [p for p in extra if p.key not in seen and p.key.split(".")[0] not in broken]
        raise AnswerError(source, problems) from None


def parse_answers(text: str, source: str = "<answers>") -> Answers:
    """Parse and validate the text of an answer file (the file alone, not yet against this machine)."""
    return validate_data(schema.parse_toml(text, source, AnswerError), source)


def load_answers(path: str | Path) -> Answers:
    """Read (a regular file of at most inputs.MAX_FILE_BYTES), parse and validate an answer file."""
    return schema.load_file(path, lambda text, source, _stem: parse_answers(text, source), error=AnswerError,
                            missing=_missing)


def _missing(path: str | os.PathLike[str]) -> AnswerError:
    return AnswerError(str(path), [ProfileProblem("(file)", str(path), "no such file", "an existing TOML file")])


# ------------------------------------------------------------------------------------- against the machine
@dataclass(frozen=True)
class Resolved:
    """Answers that fit this machine: the disk and NICs they name, the root password hash, the install id."""

    answers: Answers
    source: str
    disk: Disk
    private_nic: Nic | None
    campus_nic: Nic | None
    password_hash: str | None
    install_id: str
    resume: bool  # the disk carries an earlier install from the same answers (interrupted or finished)
    machine: Machine  # the snapshot checked against (apply re-probes the same way before writing)


def _disk_choices(machine: Machine) -> str:
    usable = [d for d in machine.disks if d.status != "refused"]
    if not usable:
        return "none on this machine (every disk is refused; `cloudbox install disks` says why)"
    return ", ".join(
        f"{(d.by_id[0] if d.by_id else d.path)} ({d.status})" for d in usable
    )


def _nic_choices(machine: Machine) -> str:
    return ", ".join(n.describe() for n in machine.nics) or "none (this machine has no physical NIC)"


def check_answers(answers: Answers, machine: Machine, source: str = "<answers>") -> Resolved:
    """Check validated answers against this machine; every problem at once as an AnswerError."""
    problems: list[ProfileProblem] = []

    def bad(key: str, value: object, message: str, allowed: str) -> None:
        problems.append(ProfileProblem(key, value, message, allowed))

    iid = answers.install_id
    target = answers.disk.target
    disk: Disk | None = None
    by_id_prefix = machine.by_id_dir.rstrip("/") + "/"
    # The rule is on the normalised path: /dev/disk/by-id/../../sda names /dev/sda, a name that can change.
    if posixpath.dirname(posixpath.normpath(target)) + "/" != by_id_prefix:
        bad("disk.target", target, f"name the disk by its {by_id_prefix} path, which stays the same across reboots "
            "(/dev/sdX names do not)", _disk_choices(machine))
    else:
        disk = find_disk(machine.disks, target)
        if disk is None:
            bad("disk.target", target, "no such disk on this machine", _disk_choices(machine))
    resume = False
    if disk is not None:
        ours = disk.install_id_matches(iid)
        serial = answers.disk.confirm_serial
        if disk.refusals:
            bad("disk.target", target, "cloudbox never installs onto this disk: " + "; ".join(disk.refusals),
                _disk_choices(machine))
        elif ours:
            resume = True  # written by an earlier run of these same answers: resume it, or nothing to do
        elif disk.has_data and not disk.serial:
            bad("disk.target", target, f"{disk.path} holds data ({'; '.join(disk.signatures)}) and has no serial "
                "number to confirm its destruction with", "a blank disk, or wipe this one first (wipefs --all)")
        elif disk.has_data and serial is None:
            bad("disk.confirm_serial", None, f"{disk.path} holds data ({'; '.join(disk.signatures)}); it is "
                "erased only when the answer file names its serial number", f"{disk.serial!r} (erases {disk.path})")
        if serial is not None and disk.serial and serial != disk.serial and not disk.refusals:
            bad("disk.confirm_serial", serial, f"does not match the serial of {disk.path}",
                f"{disk.serial!r} (the serial of {target})")

    nics: dict[str, Nic | None] = {}
    for key in ("private_nic", "campus_nic"):
        ident = getattr(answers.network, key)
        nics[key] = None
        if ident is None:
            continue
        nic = machine.nic(ident)
        if nic is None:
            bad(f"network.{key}", ident, "no such NIC on this machine", _nic_choices(machine))
        nics[key] = nic
    pn, cn = nics["private_nic"], nics["campus_nic"]
    if pn is not None and cn is not None and pn.name == cn.name and (
        (answers.network.private_nic or "").lower() != (answers.network.campus_nic or "").lower()
    ):
        bad("network.campus_nic", answers.network.campus_nic,
            f"names the same NIC ({cn.name}) as network.private_nic; one NIC cannot face both networks",
            f"a NIC other than {pn.name}: {_nic_choices(machine)}")

    password_hash = answers.root.password_hash
    cred = answers.root.password_credential
    if cred is not None:
        path = machine.credential(cred)
        if path is None:
            bad("root.password_credential", cred, "no such credential was passed to this system",
                "a credential in " + ", ".join(str(d) for d in machine.cred_dirs))
        else:
            try:
                value = inputs.read_text_file(path, limit=4096).strip()
            except (OSError, inputs.InputProblem):
                value = ""
            if inputs.control_chars(value) or not re.fullmatch(PASSWORD_HASH_PATTERN, value):
                bad("root.password_credential", cred, f"{path} does not hold a password hash",
                    _TEXT_RULES["root.password_hash"])
            else:
                password_hash = value
    if problems:
        raise AnswerError(source, problems)
    assert disk is not None
    return Resolved(answers, source, disk, pn, cn, password_hash, iid, resume, machine)

