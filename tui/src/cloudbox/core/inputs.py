"""The one door for what cloudbox reads from a user, a file or another machine, and the one way such text is shown.

In:
- `read_text_file`: regular files only (a FIFO or a device is refused without opening it for a blocking read),
  at most a size cap, UTF-8;
- `load_toml` / `load_json`: nesting and number-length caps checked on the text before the parser sees it, and
  every parser failure (syntax, RecursionError, Python's int-digits limit) turned into an `InputProblem` with
  the line;
- `control_chars` / `path_problem`: strings that will be shown or used as paths carry no control character,
  NUL or bidirectional override; a path is absolute and already normalised (no `..`, `//`, `.`);
- `ip_address`, `FRONTEND_ADDRESS_RULE`, `PRIVATE_RANGES`: addresses with IPv4-mapped IPv6 unwrapped first and
  checked against the documented ranges only.

Out: `printable()` is the one escaping function for every string from a node, a peer or a file that reaches a
terminal (control characters become visible escapes, so a newline cannot forge a table row); `shown()` renders
an offending value for a problem report (escaped, cut with its length said, no Python forms).

The limits are in one table in docs/install.md ("Every input and its limits").
"""

from __future__ import annotations

import ipaddress
import json
import os
import posixpath
import re
import stat
import tomllib
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_FILE_BYTES = 1024 * 1024  # profiles, answer files, the node settings: a real one is under 10 KiB
MAX_NESTING = 32  # arrays, tables and dotted keys in a TOML or JSON document
MAX_NUMBER_DIGITS = 100  # digits in one number literal (Python refuses more than 4300 on its own)
MAX_SHOWN = 80  # characters of an offending value echoed in a message

# Bidirectional overrides and isolates reorder what a terminal shows; line and paragraph separators break lines.
_INVISIBLE = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029")


class InputProblem(Exception):
    """One thing wrong with an input: `where` is a dotted key or "line N" (or "(file)"), `value` the offending
    text or value, `message` what is wrong, `allowed` what would be accepted."""

    def __init__(self, where: str, value: object, message: str, allowed: str):
        super().__init__(where, message)
        self.where, self.value, self.message, self.allowed = where, value, message, allowed

    def __str__(self) -> str:
        return f"{self.where}: {self.message}{got(self.value)}; allowed: {self.allowed}"


# -------------------------------------------------------------------------------------------------- showing
def _is_control(ch: str) -> bool:
    return unicodedata.category(ch) == "Cc" or ch in _INVISIBLE


def printable(text: object, keep: str = "") -> str:
    """`text` safe for a terminal: control characters (C0, DEL, C1), bidi overrides and line separators become
    visible escapes (\\n, \\x1b, \\u202e); everything else is kept, and so are the characters in `keep`
    (e.g. "\\t\\n" for a tool's raw output)."""
    s = str(text)
    if not any(_is_control(c) and c not in keep for c in s):
        return s
    out = []
    for c in s:
        if not _is_control(c) or c in keep:
            out.append(c)
        elif c in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[c])
        elif ord(c) < 0x100:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(f"\\u{ord(c):04x}")
    return "".join(out)


def cut(text: str, limit: int = MAX_SHOWN) -> str:
    """`text` cut to `limit` characters, saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def shown(value: object, limit: int = MAX_SHOWN) -> str:
    """An offending value as a problem report shows it: strings quoted, escaped and cut; TOML's true/false; bytes
    as hex; lists and tables in brief. Never a Python repr."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return cut(str(value), limit)
    if isinstance(value, bytes | bytearray):
        return "the bytes " + cut(" ".join(f"0x{b:02x}" for b in value[:limit]), limit)
    if isinstance(value, str):
        quote = '"' if "'" in value and '"' not in value else "'"
        return quote + cut(printable(value), limit) + quote
    if isinstance(value, list | tuple):
        return cut("[" + ", ".join(shown(v, limit) for v in value[:8]) + (", …" if len(value) > 8 else "") + "]",
                   limit) + (f" ({len(value)} entries)" if len(value) > 8 else "")
    if isinstance(value, dict):
        keys = ", ".join(key_text((str(k),)) for k in list(value)[:8])
        return cut(f"a table with keys {keys}" if value else "an empty table", limit)
    return cut(printable(value), limit)


def got(value: object) -> str:
    """" (got VALUE)" for a problem line, or "" when there is no value (a missing key)."""
    return "" if value is None else f" (got {shown(value)})"


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def key_text(parts: tuple[object, ...]) -> str:
    """A key path as TOML writes it: bare parts joined by dots, other parts quoted ("disk.cache" stays one key)."""
    out = []
    for p in parts:
        s = str(p)
        out.append(s if _BARE_KEY.fullmatch(s) else json.dumps(printable(cut(s))))
    return ".".join(out)


# -------------------------------------------------------------------------------------------------- strings
def control_chars(value: str) -> str | None:
    """None when `value` holds no control character; else which one, e.g. "a control character (U+001B)"."""
    for c in value:
        if c == "\x00":
            return "a NUL byte (U+0000)"
        if _is_control(c):
            return f"a control character (U+{ord(c):04X})"
    return None


def path_problem(value: str) -> str | None:
    """None for an absolute, normalised path without control characters; else what is wrong with it."""
    bad = control_chars(value)
    if bad:
        return f"contains {bad}"
    if not value.startswith("/"):
        return "not an absolute path"
    norm = posixpath.normpath(value)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    if norm != value:
        return f"not a normalised path (it names {norm})"
    return None


def checked_path(value: str) -> str:
    """`value` when path_problem finds nothing; else a ValueError saying what (a pydantic AfterValidator)."""
    problem = path_problem(value)
    if problem:
        raise ValueError(problem)
    return value


# ---------------------------------------------------------------------------------------------------- files
def read_text_file(path: str | os.PathLike[str], *, limit: int = MAX_FILE_BYTES) -> str:
    """The text of a regular file of at most `limit` bytes; an InputProblem at "(file)" otherwise (a FIFO, a
    device, a directory, too big, unreadable, not UTF-8). FileNotFoundError passes through for the caller."""
    p = Path(path)
    if "\x00" in str(p):
        raise InputProblem("(file)", str(p), "the file name contains a NUL byte", "a path to a regular file")
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as e:
        raise InputProblem("(file)", str(p), f"cannot open it: {e.strerror or e}", "a readable regular file") \
            from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputProblem("(file)", str(p), f"not a regular file (it is {_file_kind(st.st_mode)})",
                               "a regular file")
        if st.st_size > limit:
            raise InputProblem("(file)", str(p), f"{st.st_size} bytes, more than the {limit} allowed",
                               f"a file of at most {limit} bytes")
        try:
            raw = os.read(fd, limit + 1)
            while len(raw) <= limit and (more := os.read(fd, limit + 1 - len(raw))):
                raw += more
        except OSError as e:
            raise InputProblem("(file)", str(p), f"cannot read it: {e.strerror or e}", "a readable regular file") \
                from None
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise InputProblem("(file)", str(p), f"more than the {limit} bytes allowed", f"a file of at most {limit} "
                           "bytes")
    return decode(raw)


def decode(raw: bytes) -> str:
    """UTF-8 text, or an InputProblem naming the line and the bytes that are not."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise InputProblem(f"line {line}", raw[e.start:e.end], "not UTF-8 text", "a UTF-8 text file") from None


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


# ------------------------------------------------------------------------------------------------ documents
@dataclass
class _Scan:
    depth_line: int = 0  # first line where nesting passes the cap
    depth: int = 0
    number_line: int = 0  # first line with a number literal longer than the cap
    number: str = ""


def _scan(text: str, *, toml: bool, max_depth: int, max_digits: int) -> _Scan:
    """Nesting depth and number lengths outside strings and comments, without parsing: what keeps the recursive
    parsers (and Python's int()) from ever seeing a document that would break them."""
    out = _Scan()
    depth = 0
    line = 1
    i, n = 0, len(text)
    key_dots = 0  # dots in a TOML key (before '=' at depth 0, or in a [table] header)
    at_key = True
    run_start = -1
    while i < n:
        c = text[i]
        if c.isdigit() or (c == "_" and run_start >= 0):
            if run_start < 0:
                run_start = i
            i += 1
            continue
        if run_start >= 0:
            if i - run_start > max_digits and not out.number_line:
                out.number_line, out.number = line, text[run_start:i]
            run_start = -1
        if c == "\n":
            line += 1
            if depth == 0:
                at_key, key_dots = True, 0
        elif toml and c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        elif c in "\"'":
            triple = toml and text.startswith(c * 3, i)
            quote = c * 3 if triple else c
            j = i + len(quote)
            while j < n:
                if text.startswith(quote, j):
                    break
                if text[j] == "\\" and (c == '"' or not toml):
                    j += 1
                elif text[j] == "\n":
                    line += 1
                    if not triple and toml:
                        break  # an unterminated one-line string: the parser says so
                j += 1
            i = j + (len(quote) if j < n and text.startswith(quote, j) else 0)
            continue
        elif c in "[{":
            depth += 1
            if toml and depth == 1 and at_key and c == "[":
                key_dots = 0  # a table header: its dots count as nesting
            if depth > out.depth:
                out.depth = depth
            if depth > max_depth and not out.depth_line:
                out.depth_line = line
        elif c in "]}":
            depth = max(0, depth - 1)
        elif toml and c == "=" and depth == 0:
            at_key = False
        elif toml and c == "." and (at_key or depth == 1):
            key_dots += 1
            if key_dots + 1 > max_depth and not out.depth_line:
                out.depth_line = line
        i += 1
    if run_start >= 0 and n - run_start > max_digits and not out.number_line:
        out.number_line, out.number = line, text[run_start:]
    return out


def _excerpt(text: str, line: int) -> str:
    lines = text.splitlines()
    return lines[line - 1] if 0 < line <= len(lines) else ""


def nesting(data: object, limit: int) -> int:
    """Nesting depth of parsed data, counting no further than limit + 1."""
    stack = [(data, 1)]
    worst = 0
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            worst = max(worst, d)
            if d > limit:
                return d
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return worst


def _precheck(text: str, *, toml: bool, max_depth: int, max_digits: int) -> _Scan:
    scan = _scan(text, toml=toml, max_depth=max_depth, max_digits=max_digits)
    if scan.depth_line:
        raise InputProblem(f"line {scan.depth_line}", _excerpt(text, scan.depth_line),
                           f"nested more than {max_depth} levels deep",
                           f"arrays, tables and dotted keys nested at most {max_depth} levels")
    if scan.number_line:
        raise InputProblem(f"line {scan.number_line}", scan.number, f"a number {len(scan.number)} digits long",
                           f"numbers of at most {max_digits} digits")
    return scan


_TOML_LOCATION = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)$")


def load_toml(text: str, *, max_depth: int = MAX_NESTING, max_digits: int = MAX_NUMBER_DIGITS) -> dict[str, Any]:
    """Parse TOML text; any failure is an InputProblem at "line N" with the line's text."""
    _precheck(text, toml=True, max_depth=max_depth, max_digits=max_digits)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = _TOML_LOCATION.search(msg)
        line = int(m.group(1)) if m and m.group(1) else max(len(text.splitlines()), 1)
        if m:
            msg = msg[: m.start()]
        raise InputProblem(f"line {line}", _excerpt(text, line), f"TOML syntax error: {msg}",
                           "TOML 1.0 syntax (https://toml.io)") from None
    except (RecursionError, ValueError) as exc:  # the scan keeps these away; this is the net under it
        raise InputProblem("line 1", _excerpt(text, 1), f"the TOML parser gave up: {exc}",
                           f"TOML 1.0 nested at most {max_depth} levels, numbers of at most {max_digits} digits") \
            from None
    if nesting(data, max_depth) > max_depth:
        raise InputProblem("line 1", _excerpt(text, 1), f"nested more than {max_depth} levels deep",
                           f"arrays, tables and dotted keys nested at most {max_depth} levels")
    return data


def load_json(text: str | bytes, *, max_depth: int = MAX_NESTING, max_digits: int = MAX_NUMBER_DIGITS) -> Any:
    """Parse JSON text; any failure (syntax, depth, huge numbers, not UTF-8) is an InputProblem at "line N"."""
    if isinstance(text, bytes | bytearray):
        text = decode(bytes(text))
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise InputProblem(f"line {line}", _excerpt(text, line), "contains a NUL byte", "JSON text")
    _precheck(text, toml=False, max_depth=max_depth, max_digits=max_digits)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputProblem(f"line {exc.lineno}", _excerpt(text, exc.lineno), f"not JSON: {exc.msg}", "JSON text") \
            from None
    except (RecursionError, ValueError) as exc:
        raise InputProblem("line 1", _excerpt(text, 1), f"the JSON parser gave up: {exc}",
                           f"JSON nested at most {max_depth} levels") from None
    if nesting(data, max_depth) > max_depth:
        raise InputProblem("line 1", _excerpt(text, 1), f"nested more than {max_depth} levels deep",
                           f"JSON nested at most {max_depth} levels")
    return data


# ------------------------------------------------------------------------------------------------ addresses
PRIVATE_RANGES = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
PRIVATE_RANGES_TEXT = "10/8, 172.16/12, 192.168/16"
FRONTEND_ADDRESS_RULE = "not loopback, unspecified, multicast or the limited broadcast address"
_LIMITED_BROADCAST = ipaddress.IPv4Address("255.255.255.255")


def a_or_an(word: str) -> str:
    """"an all-in-one", "a front-end": the article for `word`, by its first letter."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name `name` most likely meant (a typo, another case), or None when none is close."""
    import difflib

    pool = list(known)
    lower = {k.lower(): k for k in pool}
    if name.lower() in lower:
        return lower[name.lower()]
    hit = difflib.get_close_matches(name.lower(), list(lower), n=1, cutoff=0.6)
    return lower[hit[0]] if hit else None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """" (did you mean virtio-disk?)" when a known name is close to `name`, else ""."""
    hit = closest(name, known)
    return f" (did you mean {hit}?)" if hit else ""


def ip_address(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An IP address with an IPv4-mapped IPv6 form (::ffff:A.B.C.D) unwrapped to its IPv4 address; ValueError for
    anything else than an address (control characters included, which ipaddress lets through in a scope id)."""
    if control_chars(value):
        raise ValueError(f"contains {control_chars(value)}")
    addr = ipaddress.ip_address(value)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def peer_address_problem(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why `addr` cannot be another node's address (loopback, unspecified, multicast, limited broadcast)."""
    if addr.is_loopback:
        return "a loopback address"
    if addr.is_unspecified:
        return "the unspecified address"
    if addr.is_multicast:
        return "a multicast address"
    if addr == _LIMITED_BROADCAST:
        return "the limited broadcast address"
    return None


def in_private_ranges(addr: ipaddress.IPv4Address) -> bool:
    """Whether `addr` is in the documented private ranges (RFC 1918), not Python's wider is_private."""
    return any(addr in net for net in PRIVATE_RANGES)


def normal_address(value: str) -> str:
    """An address as both ends of a connection compare it: IPv4-mapped IPv6 unwrapped, compressed form."""
    try:
        return str(ip_address(value.split("%", 1)[0]))
    except ValueError:
        return value


def stdin_limit_read(stream: Any, limit: int) -> bytes:
    """At most `limit` bytes from a binary stream; an InputProblem when there is more."""
    raw = stream.read(limit + 1)
    if len(raw) > limit:
        raise InputProblem("(stdin)", None, f"more than the {limit} bytes allowed", f"at most {limit} bytes")
    return bytes(raw)

