"""The node's reading of what a front-end sends `cloudbox node local` on standard input, through the wire's schemas.

`read_request` takes a start-run request through the input layer (at most protocol.MAX_REQUEST_BYTES of JSON) and
core.cluster.protocol's `StartRun` and `run_settings()`, which are built from RunSpec's fields: a setting the
front-end sends is checked against its field's declared type, then by RunSpec's own checks, and the profiles must
validate. `read_volume_creds` reads the volume-creds request. Anything else is a `BadRequest` naming what is wrong
(the CLI exits 2).
"""

from __future__ import annotations

import types
import typing
from typing import IO, Any

import pydantic

from cloudbox.core import inputs
from cloudbox.core.cluster import protocol
from cloudbox.core.errors import CloudboxError
from cloudbox.core.spec import profiles
from cloudbox.core.spec.runspec import MAX_GUESTS, RunSpec


class BadRequest(CloudboxError):
    """A `node local` request that is not what this cloudbox understands (exit 2)."""


def _form(annotation: Any) -> str:
    """How the request's shape names a field's value: {...}, "..." or ["...", ...]."""
    kinds = [a for a in typing.get_args(annotation) if a is not type(None)] \
        if typing.get_origin(annotation) in (typing.Union, types.UnionType) else [annotation]
    kind = kinds[0]
    while typing.get_origin(kind) is typing.Annotated:
        kind = typing.get_args(kind)[0]
    return {dict: "{...}", list: '["...", ...]'}.get(typing.get_origin(kind) or kind, '"..."')


SHAPE = "a JSON object {" + ", ".join(f"{k}: {_form(f.annotation)}"
                                      for k, f in protocol.StartRun.model_fields.items()) + "}"


def _load(stream: IO[bytes], what: str) -> Any:
    try:
        return inputs.load_json(inputs.stdin_limit_read(stream, protocol.MAX_REQUEST_BYTES))
    except inputs.InputProblem as e:
        raise BadRequest(f"{what}: the request on stdin: {e}") from None


def read_volume_creds(stream: IO[bytes]) -> Any:
    """A volume-creds request: any JSON value through the input layer (core.disks.volumes.nodecreds checks it)."""
    return _load(stream, "volume-creds")


def read_request(stream: IO[bytes]) -> dict[str, Any]:
    """A start-run request from the front-end: at most protocol.MAX_REQUEST_BYTES of JSON nested at most
    inputs.MAX_NESTING deep, of protocol.StartRun's shape (spec an object, profile_toml a string, image_dir an
    absolute path, optional, and for a mixed run mix_tomls, 2 to MAX_GUESTS profiles' TOML, the guests' in turn);
    then its settings (_check_spec) and its profiles. Anything else is a BadRequest naming what is wrong."""
    req = _load(stream, "start-run")
    if not isinstance(req, dict):
        raise BadRequest(f"start-run: the request is {inputs.shown(req)}; allowed: {SHAPE}")
    try:
        protocol.StartRun.model_validate(req)
    except pydantic.ValidationError as exc:
        raise BadRequest(_envelope_problem(req, exc.errors())) from None
    _check_spec(req["spec"])
    try:
        profiles.parse_profile(req["profile_toml"], "start-run: field profile_toml")
        for k, text in enumerate(req.get("mix_tomls") or [], 1):
            profiles.parse_profile(text, f"start-run: field mix_tomls, profile {k}")
    except CloudboxError as e:
        raise BadRequest(str(e)) from None
    return req


def _envelope_problem(req: dict[str, Any], errors: list[Any]) -> str:
    """The first thing wrong with the request's own fields, in this order: a field of the wrong type (or missing),
    an image_dir that is not an absolute path, fields this node does not know, a bad list of mixed profiles."""
    fields = list(protocol.StartRun.model_fields)

    def rank(err: Any) -> tuple[int, int]:
        key = str(err["loc"][0]) if err["loc"] else ""
        if err["type"] == "extra_forbidden":
            return 2, 0
        if key == "mix_tomls":
            return 3, 0
        if key == "image_dir" and err["type"] == "value_error":
            return 1, 0
        return 0, fields.index(key) if key in fields else 0

    first = min(errors, key=rank)
    key = str(first["loc"][0])
    if first["type"] == "extra_forbidden":
        unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
        return f"start-run: unknown field(s) {', '.join(map(inputs.printable, unknown))}; allowed: {SHAPE}"
    if key == "mix_tomls":
        return (f"start-run: field mix_tomls: {inputs.shown(req.get(key))}; allowed: a list of 2 to {MAX_GUESTS} "
                "profiles' TOML texts")
    if key == "image_dir" and first["type"] == "value_error":
        return (f"start-run: field image_dir: {inputs.shown(req[key])} {inputs.path_problem(req[key])}; allowed: an "
                "absolute path")
    return f"start-run: field {key}: {inputs.shown(req.get(key))}; allowed: {SHAPE}"


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is list:
        return f"a list of {' or '.join(_type_name(a) for a in typing.get_args(hint))}"
    return "int or float" if hint is float else getattr(hint, "__name__", str(hint))


def _check_spec(spec: dict[str, Any]) -> None:
    """The run settings in a start-run request against protocol.run_settings(), RunSpec's fields: the first setting
    (in the request's order) this node does not know or that is not of its field's type, then RunSpec's own
    checks."""
    try:
        protocol.run_settings().model_validate(spec)
    except pydantic.ValidationError as exc:
        order = list(spec)
        first = min(exc.errors(), key=lambda e: order.index(e["loc"][0]) if e["loc"][0] in order else len(order))
        key = str(first["loc"][0])
        types = protocol.setting_types()
        if first["type"] == "extra_forbidden":
            raise BadRequest(f"start-run: unknown run setting {inputs.shown(key)}; allowed: {', '.join(types)} "
                             "(update this node's cloudbox)") from None
        raise BadRequest(f"start-run: run setting {key}: {inputs.shown(spec[key])}; allowed: "
                         f"{_type_name(types[key])} without control characters") from None
    try:
        RunSpec(**{"profile": "x", **{k: v for k, v in spec.items() if k != "profile"}}).validate()
    except CloudboxError as e:
        raise BadRequest(f"start-run: {e}") from None
