"""What crosses the wire between cloudbox hosts, declared once: the enrolment's messages, a node's requests, limits.

Two conversations (docs/cluster.md has the design and the threat model):

- enrolment: JSON lines over TCP (PORT), protocol VERSION. `Hello` (back-end -> front-end) and `Challenge` (front-end
  -> back-end) and `Proof` are their schemas on schema.Wire; `checked` turns the first thing wrong with one into the
  refusal's words ("field name: invalid value '...'; allowed: ..."). A refusal carries one of REASONS.
- a front-end's work on a node over the pinned SSH (`cloudbox node local OP`, core.cluster.client and the node's
  agent): the guest image's files (IMAGE_FILES, SUMS), a spread run's coordination lines (COORD_LINE_LIMIT) and the
  start-run request: `StartRun` (the run settings, the resolved profile, the image directory, a mixed run's
  profiles, at most MAX_REQUEST_BYTES) whose settings are `RunSettings`, built from RunSpec's fields: every
  setting a front-end can send is a field, of the field's declared type, without control characters.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from typing import Annotated, Any

import pydantic
from pydantic import AfterValidator, ConfigDict, Field

from .. import inputs
from ..spec.nodeconf import NODE_NAME_ALLOWED, NODE_NAME_PATTERN
from ..spec.runspec import MAX_GUESTS, RunSpec
from ..spec.schema import NoControls, Wire, clean_strings
from . import keys

# ------------------------------------------------------------------------------------------------ enrolment
PORT = 7413
VERSION = 2
MAX_LINE = 64 * 1024
MAX_MESSAGE_NESTING = 4  # the messages are flat objects
HOST_SIG_NAMESPACE = "cloudbox-enrol@v2"
ENROL_ROLES = ("back-end",)

REASONS = {
    "bad-request": "the message is malformed or a field is invalid",
    "no-open-code": "the front-end has no open join code",
    "wrong-code": "the code does not match any code of this front-end",
    "code-used": "the code was already used (codes are one-time)",
    "code-expired": "the code expired",
    "code-revoked": "the code was revoked",
    "rate-limited": "too many failed attempts",
    "name-taken": "the node name is enrolled with another host key",
    "key-taken": "the host key is enrolled under another name",
    "key-unproven": "the node name is enrolled, and the back-end did not prove it holds that host key",
    "address-mismatch": "the two ends see different addresses: something relays the connection",
    "busy": "the enrolment server serves as many connections as it takes; try again in a moment",
    "not-confirmed": "the back-end did not confirm installing the front-end's key",
    "front-end-unproven": "the front-end did not prove it knows the code",
}


class Said(ValueError):
    """A field's refusal in its own words (not "invalid value"), carried out of pydantic's validators."""


def _version(v: Any) -> Any:
    if v != VERSION:
        raise Said(f"field v: protocol version {inputs.shown(v)} is not supported; allowed: {VERSION} (update "
                   "cloudbox on the back-end)")
    return v


def _enrol_role(v: str) -> str:
    if v not in ENROL_ROLES:
        raise Said(f"field role: {inputs.shown(v)} cannot enrol with a front-end; allowed: {', '.join(ENROL_ROLES)}")
    return v


def _public_key(key: str) -> typing.Callable[[str], str]:
    def check(v: str) -> str:
        try:
            keys.parse_public_key(v, what=f"field {key}")
        except keys.KeyProblem as e:
            raise Said(str(e)) from None
        return v
    return check


class Relayed(Said):
    """The other side sees an address differently from this side: something relays the connection."""


def _address(v: str) -> str:
    try:
        return str(inputs.ip_address(v))
    except ValueError:
        raise ValueError("not an address") from None


def _seen_alike(v: str, info: pydantic.ValidationInfo) -> str:
    """The address as this side sees it (checked()'s `seen`, by field: the address and what it is), or Relayed."""
    seen = (info.context or {}).get(info.field_name)
    if seen is not None and inputs.normal_address(seen[0]) != inputs.normal_address(v):
        raise Relayed(f"{seen[1]}: this side sees {seen[0]}, the other side {v}; something relays the connection "
                      "(enrol over the private network, without NAT or a proxy)")
    return v


Name = Annotated[str, Field(pattern=NODE_NAME_PATTERN), NoControls]
Port = Annotated[int, Field(ge=1, le=65535)]
Hex64 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$"), NoControls]
Address = Annotated[str, Field(pattern=r"^[0-9A-Fa-f:.]{2,45}$"), NoControls, AfterValidator(_address),
                    AfterValidator(_seen_alike)]

# What each field accepts, as an "invalid value" refusal says it (a field not here says only that the value is invalid).
ALLOWED = {"name": NODE_NAME_ALLOWED, "ssh_port": "an integer 1..65535", "nonce": "64 hex digits",
           "salt": "32 hex digits", "mac": "64 hex digits", "address": "an IPv4 or IPv6 address",
           "front_end_address": "an IPv4 or IPv6 address", "back_end_address": "an IPv4 or IPv6 address"}


class Message(Wire):
    """A message of the enrolment: its fields checked in declaration order, others (its type) left to the caller."""

    model_config = ConfigDict(extra="ignore")  # the type and the fields a side does not act on


class Hello(Message):
    """The back-end's first message: who it is, its keys and both addresses as it sees them (checked in this order,
    each address against the front-end's view of it)."""

    v: Annotated[Any, AfterValidator(_version)] = Field(None, validate_default=True)
    name: Name
    role: Annotated[str, NoControls, AfterValidator(_enrol_role)]
    ssh_port: Port
    nonce: Hex64
    host_key: Annotated[str, NoControls, AfterValidator(_public_key("host_key"))]
    client_key: Annotated[str, NoControls, AfterValidator(_public_key("client_key"))]
    address: Address
    front_end_address: Address


class Challenge(Message):
    """The front-end's answer to a hello: who it is, its keys, the code's salt and both addresses as it sees them
    (each checked against the back-end's view of it)."""

    name: Name
    nonce: Hex64
    salt: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$"), NoControls]
    host_key: Annotated[str, NoControls, AfterValidator(_public_key("host_key"))]
    mgmt_key: Annotated[str, NoControls, AfterValidator(_public_key("mgmt_key"))]
    ssh_port: Port
    back_end_address: Address
    address: Address


class Proof(Message):
    """The back-end's proof that it knows the code, and (optional) its host key's signature of the transcript."""

    mac: Hex64


_M = typing.TypeVar("_M", bound=Message)


class FieldProblem(ValueError):
    """The first field of a message that is wrong, with the refusal's words and reason (one of REASONS); `valid` are
    the fields checked before it, which are right."""

    def __init__(self, message: str, reason: str, field: str, valid: tuple[str, ...]):
        super().__init__(message)
        self.reason, self.field, self.valid = reason, field, valid


def checked(kind: type[_M], msg: dict[str, Any], seen: dict[str, tuple[str, str]] | None = None) -> _M:
    """`msg` as a `kind` message, or a FieldProblem for its first field that is wrong, in the schema's order:
    "field name: invalid value '...'; allowed: ...", the field's own words (a version, a role, a key), or an
    address-mismatch when an address field differs from this side's view of it (`seen`: field -> (address, what
    it is))."""
    try:
        return kind.model_validate(msg, context=seen or {})
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
    key = str(err["loc"][0])
    order = list(kind.model_fields)
    valid = tuple(order[:order.index(key)]) if key in order else ()
    said = (err.get("ctx") or {}).get("error")
    if isinstance(said, Said):
        raise FieldProblem(str(said), "address-mismatch" if isinstance(said, Relayed) else "bad-request", key,
                           valid) from None
    allowed = ALLOWED.get(key)
    raise FieldProblem(f"field {key}: invalid value {inputs.shown(msg.get(key))}"
                       + (f"; allowed: {allowed}" if allowed else ""), "bad-request", key, valid) from None


# ------------------------------------------------------------------------------------------ work on a node
IMAGE_FILES = ("vmlinuz", "initrd.img", "mpi.img", "manifest.json")  # mpi.img: a node's MPI jobs
SUMS = "SHA256SUMS"
COORD_LINE_LIMIT = 256  # a coordination line ("go RUN TEST AT") is under 100 characters
MAX_REQUEST_BYTES = 4 * 1024 * 1024  # a start-run request: the spec and a profile's TOML (a few KiB)


class StartRun(Wire):
    """A start-run request: the run settings (RunSettings), the front-end's resolved profile, where the propagated
    guest image is, and for a mixed run its profiles in the order the node's guests take them."""

    spec: dict[str, Any]
    profile_toml: str
    image_dir: Annotated[str, AfterValidator(inputs.checked_path)] | None = None
    mix_tomls: Annotated[list[str], Field(min_length=2, max_length=MAX_GUESTS)] | None = None

    def to_bytes(self) -> bytes:
        """The request as the node reads it on stdin: mix_tomls only for a mixed run (an older node refuses the
        field it does not know)."""
        return json.dumps(self.model_dump(exclude_none=True)).encode()


def _clean(v: Any) -> Any:
    if not clean_strings(v):
        raise ValueError("contains a control character")
    return v


@functools.cache
def run_settings() -> type[Wire]:
    """The run settings' schema, built from RunSpec's fields: each optional, of its field's type (strict: no bool for
    a number, no text for a list, no NaN), its strings without control characters."""
    types = typing.get_type_hints(RunSpec)
    fields: dict[str, Any] = {f.name: (Annotated[types[f.name], AfterValidator(_clean)], None)
                              for f in dataclasses.fields(RunSpec)}
    return pydantic.create_model("RunSettings", __base__=Wire, **fields)


def setting_types() -> dict[str, Any]:
    """Each run setting's declared type, by name, in RunSpec's order."""
    types = typing.get_type_hints(RunSpec)
    return {f.name: types[f.name] for f in dataclasses.fields(RunSpec)}
