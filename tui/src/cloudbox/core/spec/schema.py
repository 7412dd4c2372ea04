"""The schema layer every validated input shares: strict models, safe strings, problems, and TOML files kept parsed.

Profiles, install answer files and the cluster's wire messages (and the studies, through the same calls) are
pydantic models on `Strict`: closed (an unknown key is an error), strict (no str->int coercion) and immutable.
This module provides:

- `Strict`, and `Wire` for messages from another machine (also no NaN or infinity);
- strings that will be shown or stored: `NoControls` (no control character, NUL or bidi override), `OneLine`
  (one line of text, 1..200 characters) and `clean_strings` for whole JSON values;
- `problems_from`: a pydantic ValidationError as cloudbox's problems ("key: message (got value); allowed: ..."),
  its error types in words (`PYDANTIC_MESSAGES`) and the offending value as plain data (`plain_value`), with
  `CrossFieldProblems` carrying a model's own rules out of its validator, and the helpers that derive the
  "allowed" text from a model (`model_at`, `keys_text`, `field_allowed`);
- `parse_toml`, `read_file` and `load_file` with `Parsed`: a document's text through the input layer, any problem
  as the caller's error naming the file, and what a file parsed to kept by (path, text).
"""

from __future__ import annotations

import json
import os
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, TypeVar

import annotated_types
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from cloudbox.core import inputs
from cloudbox.core.errors import ProblemsError, ProfileProblem, problem_from
from cloudbox.core.inputs import MAX_NESTING, nesting

T = TypeVar("T")
Loc = tuple[str | int, ...]


class Strict(BaseModel):
    """A closed, strict, immutable model: an unknown key, a wrong type or a coerced value is a problem."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Wire(Strict):
    """A message from another machine: strict, and a number is never NaN or infinite (JSON has neither)."""

    model_config = ConfigDict(allow_inf_nan=False)


# ------------------------------------------------------------------------------------------------- strings
def no_controls(v: str) -> str:
    """`v`, or a ValueError naming its first control character (NUL, C0, DEL, C1, bidi override, separator)."""
    bad = inputs.control_chars(v)
    if bad:
        raise ValueError(f"contains {bad}")
    return v


NoControls = AfterValidator(no_controls)  # after any length or pattern: those are what a problem names first
ONE_LINE = r"^[^\n\r]*\S[^\n\r]*$"
OneLine = Annotated[str, Field(min_length=1, max_length=200, pattern=ONE_LINE), NoControls]


def clean_strings(value: object) -> bool:
    """No string in `value` (a string, or a list of them at any depth) holds a control character."""
    if isinstance(value, str):
        return not inputs.control_chars(value)
    return not isinstance(value, list) or all(clean_strings(v) for v in value)


# ------------------------------------------------------------------------------------- pydantic -> problems
# pydantic's error types, in words: the profile, answer-file and study problems share them.
PYDANTIC_MESSAGES = {
    "extra_forbidden": "unknown key",
    "missing": "required key is missing",
    "int_type": "must be an integer",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "list_type": "must be a list",
    "literal_error": "not an allowed value",
    "greater_than_equal": "out of range",
    "less_than_equal": "out of range",
    "string_pattern_mismatch": "not in the allowed form",
    "string_too_short": "must not be empty",
    "string_too_long": "too long",
    "too_long": "too many entries",
    "model_type": "must be a table",
    "dict_type": "must be a table",
}


def plain_value(value: object) -> object:
    """An offending value as plain data for a problem report (TOML dates and times become their text; a value
    nested deeper than the input layer allows becomes a sentence, never a recursion)."""
    if isinstance(value, dict | list) and nesting(value, MAX_NESTING) > MAX_NESTING:
        return f"a value nested more than {MAX_NESTING} levels deep"
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return str(value)[:10_000]
    return value


class CrossFieldProblems(ValueError):
    """Carries a model's own rules between keys (problems already in words) out of pydantic's validators."""

    def __init__(self, problems: list[ProfileProblem]):
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = problems


def problems_from(exc: ValidationError, *, key: Callable[[Loc], str], allowed: Callable[[Loc, str, str], str | None],
                  reword: Callable[[str, dict[str, Any], str], str] | None = None) -> list[ProfileProblem]:
    """One problem per pydantic error: `key(loc)` names the key as the file writes it, `allowed(loc, key, type)`
    says what it accepts, `reword(key, error, message)` may say a message better. The value is shown as plain data
    (nothing for a missing key); a CrossFieldProblems raised by a model validator gives its problems as they are."""
    problems: list[ProfileProblem] = []
    for err in exc.errors():
        ctx_err = (err.get("ctx") or {}).get("error")
        if isinstance(ctx_err, CrossFieldProblems):
            problems.extend(ctx_err.problems)
            continue
        loc = tuple(err["loc"])
        etype = err["type"]
        name = key(loc)
        value = None if etype == "missing" else plain_value(err.get("input"))
        message = PYDANTIC_MESSAGES.get(etype, err["msg"])
        if etype == "value_error":
            message = str(err["msg"]).removeprefix("Value error, ")
        if reword is not None:
            message = reword(name, dict(err), message)
        problems.append(ProfileProblem(name, value, message, allowed(loc, name, etype)))
    return problems


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds: itself, or the one in its list or option (`list[Rule]`, `Series | None`)."""
    if _is_model(annotation):
        return typing.cast(type[BaseModel], annotation)
    return next((a for a in typing.get_args(annotation) if _is_model(a)), None)


def model_at(root: type[BaseModel], parts: typing.Sequence[str]) -> type[BaseModel] | None:
    """The model that owns the key at `parts` ("disk", "cache" -> the disk table's model; one part -> `root`), or
    None when a part on the way is not a table (or a list or option of tables)."""
    model = root
    for part in parts[:-1]:
        field = model.model_fields.get(part)
        inner = _inner_model(field.annotation) if field is not None else None
        if inner is None:
            return None
        model = inner
    return model


def keys_text(model: type[BaseModel]) -> str:
    """A model's keys in schema order, its tables written as TOML heads them: "name, description, [guest], ..."."""
    return ", ".join(f"[{n}]" if _is_model(f.annotation) else n for n, f in model.model_fields.items())


def field_allowed(model: type[BaseModel], name: str, key: str) -> str | None:
    """What field `name` of `model` (written `key` in the file) accepts, read from its declaration: a table's keys,
    a Literal's values, true/false, an integer range, or "a string"; None when the type says nothing plainer."""
    field = model.model_fields[name]
    ann = field.annotation
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return f"a [{key}] table with keys: {keys_text(ann)}"
    if typing.get_origin(ann) is Literal:
        return ", ".join(str(a) for a in typing.get_args(ann))
    if ann is bool:
        return "true, false"
    if ann is int:
        lo = hi = None
        for m in field.metadata:
            if isinstance(m, annotated_types.Ge):
                lo = m.ge
            elif isinstance(m, annotated_types.Le):
                hi = m.le
        if lo is not None and hi is not None:
            return f"{lo}..{hi}"
        return "an integer"
    if ann is str or (isinstance(ann, types.UnionType) and str in typing.get_args(ann)):
        return "a string"
    return None


# ------------------------------------------------------------------------------------------------ TOML files
def parse_toml(text: str, source: str, error: type[ProblemsError]) -> dict[str, Any]:
    """TOML text through the input layer (nesting, number and syntax checks); a problem is `error` for `source`."""
    try:
        return inputs.load_toml(text)
    except inputs.InputProblem as e:
        raise error(source, [problem_from(e)]) from None


def read_file(path: str | os.PathLike[str], error: type[ProblemsError],
              missing: Callable[[str | os.PathLike[str]], Exception]) -> str:
    """The text of an input file (a regular file of at most inputs.MAX_FILE_BYTES, UTF-8): `missing(path)` when it
    does not exist, `error` naming it for any other problem."""
    try:
        return inputs.read_text_file(path)
    except FileNotFoundError:
        raise missing(path) from None
    except inputs.InputProblem as e:
        raise error(os.fspath(path), [problem_from(e)]) from None


class Parsed(Generic[T]):
    """What files parsed to, by (absolute path, text): screens load the same files every few seconds, and the
    parse, not the read, is what costs (make bench, "tui"). Emptied whole when `limit` entries are kept; what it
    keeps must be immutable."""

    def __init__(self, limit: int):
        self.limit = limit
        self._kept: dict[tuple[str, str], T] = {}

    def get(self, path: str | os.PathLike[str], text: str, parse: Callable[[], T]) -> T:
        key = (os.path.abspath(path), text)
        if (found := self._kept.get(key)) is None:
            found = parse()
            if len(self._kept) >= self.limit:
                self._kept.clear()
            self._kept[key] = found
        return found


def load_file(path: str | os.PathLike[str], parse: Callable[[str, str, str], T], *, error: type[ProblemsError],
              missing: Callable[[str | os.PathLike[str]], Exception], kept: Parsed[T] | None = None) -> T:
    """Read the file at `path` (read_file) and `parse(text, source, stem)` it, through `kept` when given."""
    text = read_file(path, error, missing)
    source, stem = os.fspath(path), Path(path).stem
    if kept is None:
        return parse(text, source, stem)
    return kept.get(path, text, lambda: parse(text, source, stem))
