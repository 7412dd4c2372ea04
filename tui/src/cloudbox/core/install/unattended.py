"""Where an unattended install finds its answer file, in this order:

1. a systemd credential `cloudbox.answers` (its content is the TOML; QEMU: -smbios type=11,value=
   io.systemd.credential:cloudbox.answers=...; hardware: systemd.set_credential= on the kernel command line);
2. `cloudbox.answers=PATH` on the kernel command line: PATH on the boot medium's ESP (e.g. /cloudbox/node2.toml),
   so one stick can carry the answers of several nodes;
3. /cloudbox/answers.toml on the boot medium's ESP (the FAT partition any OS can write to).

Reading writes nothing: the ESP is viewed through a read-only mount that is removed afterwards.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from cloudbox.core import inputs
from cloudbox.core.errors import AnswerError, InstallError, problem_from
from cloudbox.core.install.machine import Machine
from cloudbox.core.install.plan import readonly_view

CREDENTIAL = "cloudbox.answers"
CMDLINE_KEY = "cloudbox.answers"
DEFAULT_ESP_PATH = "/cloudbox/answers.toml"


@dataclass(frozen=True)
class AnswerSource:
    text: str
    source: str  # for messages: "credential cloudbox.answers", "/dev/vda1:/cloudbox/answers.toml"


def cmdline_answers_path(cmdline: str | None = None) -> str | None:
    if cmdline is None:
        try:
            cmdline = Path("/proc/cmdline").read_text()
        except OSError:
            return None
    value = None
    for word in cmdline.split():
        key, sep, v = word.partition("=")
        if key == CMDLINE_KEY and sep:
            value = v  # the last one wins, as for the kernel's own parameters
    return value


def find_answers(machine: Machine, esp_device: str | None, *, cmdline: str | None = None) -> AnswerSource | None:
    """The answer file for an unattended install, or None when there is none."""
    cred = machine.credential(CREDENTIAL)
    if cred is not None:
        return AnswerSource(_read(cred, f"credential {CREDENTIAL} ({cred})"), f"credential {CREDENTIAL} ({cred})")
    named = cmdline_answers_path(cmdline)
    rel = named or DEFAULT_ESP_PATH
    p = PurePosixPath(rel)
    if not p.is_absolute() or ".." in p.parts or inputs.control_chars(rel):
        raise InstallError(f"kernel command line: {CMDLINE_KEY}={inputs.printable(rel)}: must be an absolute path "
                           "without control characters on the boot "
                           f"medium's ESP, e.g. {CMDLINE_KEY}={DEFAULT_ESP_PATH}")
    if esp_device is None:
        if named:
            raise InstallError(f"kernel command line names {CMDLINE_KEY}={rel}, but the boot medium has no ESP")
        return None
    with tempfile.TemporaryDirectory(prefix="cloudbox-answers-") as tmp, \
            readonly_view(esp_device, Path(tmp) / "esp") as esp:
        f = esp / str(p).lstrip("/")
        if not f.is_file():
            if named:
                raise InstallError(f"kernel command line names {CMDLINE_KEY}={rel}, but {esp_device} has no "
                                   f"such file")
            return None
        return AnswerSource(_read(f, f"{esp_device}:{rel}"), f"{esp_device}:{rel}")


def _read(path: Path, source: str) -> str:
    """The answer file's text through the input layer (a regular file, size-capped, UTF-8)."""
    try:
        return inputs.read_text_file(path)
    except inputs.InputProblem as e:
        raise AnswerError(source, [problem_from(e)]) from None
    except OSError as e:
        raise InstallError(f"{source}: cannot read it: {e.strerror or e}") from None
