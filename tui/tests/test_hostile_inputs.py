"""Hostile input at the file doors: profiles and answer files that are not regular files, too big, nested too
deep, carry huge numbers, NULs, control characters, path tricks and address forms the documented rules refuse.
Each is refused as a problem naming the file and line or key (exit 2), never a traceback or a hang; values are
echoed escaped and cut, without Python forms."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from cloudbox.core import inputs
from cloudbox.core.errors import AnswerError, ProfileError
from cloudbox.core.install import answers as ans
from cloudbox.core.install.machine import Machine
from cloudbox.core.spec import profiles, schema

REPO = Path(__file__).resolve().parents[2]
PRESET = (REPO / "profiles" / "virtio-disk.toml").read_text()
ANSWERS = """role = "front-end"
hostname = "node1"

[disk]
target = "/dev/disk/by-id/ata-DISK_1"

[network]
private_nic = "enp1s0"
campus_nic = "enp2s0"
"""


@pytest.fixture(autouse=True)
def _profiles(isolated, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("CLOUDBOX_PROFILE_PATH", str(tmp_path / "profiles"))


def profile_file(tmp_path: Path, text: str, name: str = "virtio-disk") -> Path:
    d = tmp_path / "profiles"
    d.mkdir(exist_ok=True)
    p = d / f"{name}.toml"
    p.write_text(text)
    return p


def answer_file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "answers.toml"
    p.write_text(text)
    return p


def answers_problems(text: str) -> list:
    with pytest.raises(AnswerError) as e:
        ans.parse_answers(text, "a.toml")
    return e.value.problems


# ------------------------------------------------------------------------------------- not a regular file
@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_a_fifo_or_device_is_refused_without_blocking(tmp_path: Path, kind: str, cli_run):
    if kind == "fifo":
        path = tmp_path / "x.toml"
        os.mkfifo(path)
        what = "a FIFO"
    elif kind == "dev-zero":
        path, what = Path("/dev/zero"), "a character device"
    else:
        path, what = tmp_path, "a directory"
    rc, _, err = cli_run(["profile", "validate", str(path)])
    assert rc == 2 and f"not a regular file (it is {what})" in err and "Traceback" not in err
    rc, _, err = cli_run(["install", "--dry-run", "--answers", str(path)])
    assert rc == 2 and f"not a regular file (it is {what})" in err and "nothing was written" in err


def test_a_file_over_the_size_cap_is_refused_before_it_is_read(tmp_path: Path, cli_run):
    p = profile_file(tmp_path, PRESET.replace('description = "', 'description = "' + "a" * inputs.MAX_FILE_BYTES))
    rc, _, err = cli_run(["profile", "validate", str(p)])
    assert rc == 2 and f"more than the {inputs.MAX_FILE_BYTES} allowed" in err
    assert len(err) < 1000


# ------------------------------------------------------------------------------------- parser failures
BREAKERS = [
    ("deep-array", "a = " + "[" * 3000 + "]" * 3000 + "\n", 1, "nested more than 32 levels"),
    ("deep-inline-table", "x = 1\na = " + "{b = " * 3000 + "1" + "}" * 3000 + "\n", 2, "nested more than 32"),
    ("dotted-key", "a" + ".a" * 5000 + " = 1\n", 1, "nested more than 32 levels"),
    ("table-header", "[" + ".".join(["a"] * 500) + "]\n", 1, "nested more than 32 levels"),
    ("huge-int", 'name = "x"\n\nmemory = ' + "9" * 5000 + "\n", 3, "a number 5000 digits long"),
    ("syntax", 'name = "x"\ndescription = \n', 2, "TOML syntax error"),
]


@pytest.mark.parametrize(("text", "line", "message"), [b[1:] for b in BREAKERS], ids=[b[0] for b in BREAKERS])
def test_parser_failures_are_problems_with_a_line(tmp_path: Path, text: str, line: int, message: str, cli_run):
    p = profile_file(tmp_path, text)
    rc, _, err = cli_run(["profile", "validate", str(p)])
    assert rc == 2 and "Traceback" not in err, err
    assert f"{p}: invalid profile (1 problem)" in err and f"line {line}: {message}" in err, err
    assert len(err) < 1000  # the offending line is echoed cut, with its length
    a = answer_file(tmp_path, text)
    rc, _, err = cli_run(["install", "--dry-run", "--answers", str(a)])
    assert rc == 2 and f"line {line}: {message}" in err, err


def test_json_breakers_are_problems_too():
    for text in ["[" * 100_000, '{"a": ' + "1" * 5000 + "}", '{"a": "\x00"}', b"\xff\xfe"]:
        with pytest.raises(inputs.InputProblem) as e:
            inputs.load_json(text)
        assert e.value.where.startswith("line ")


def test_a_nul_in_a_profile_path_is_refused_not_passed_to_the_os(tmp_path: Path, cli_run):
    bad = PRESET.replace('backing = "block-device"', 'backing = "block-device"\nvolume = "/dev/sd\\u0000a"')
    p = profile_file(tmp_path, bad)
    rc, _, err = cli_run(["profile", "validate", str(p)])
    assert rc == 2 and "disk.volume: contains a NUL byte (U+0000) (got '/dev/sd\\x00a')" in err


# ------------------------------------------------------------------------------------- strings
@pytest.mark.parametrize("field", ["description", "reproduces"])
def test_control_characters_in_free_text_are_refused(tmp_path: Path, field: str):
    text = PRESET.replace('description = "', 'description = "\\u001b[2J') if field == "description" else \
        PRESET.replace('reproduces = "', 'reproduces = "study \\u001b]0;pwned\\u0007', 1)
    with pytest.raises(ProfileError) as e:
        profiles.parse_profile(text, "p.toml")
    (problem,) = e.value.problems
    assert problem.key == field and "control character (U+001B)" in problem.message
    assert "\x1b" not in str(e.value) and "\\x1b" in str(e.value)


def test_profile_list_and_show_escape_what_they_print(tmp_path: Path, monkeypatch, cli_run):
    # A profile written before the rule (or by hand into the user directory): shown escaped, never raw.
    monkeypatch.setattr(schema, "no_controls", lambda v: v)
    p = profile_file(tmp_path, PRESET)
    prof = profiles.load_profile(p)
    evil = prof.model_copy(update={"description": "ok\x1b[2J\nforged row  user  yes"})
    monkeypatch.setattr(profiles, "load_profile", lambda path: evil)
    monkeypatch.setattr(profiles, "resolve_profile", lambda ref: evil)
    for argv in (["profile", "list"], ["profile", "show", "virtio-disk"]):
        rc, out, _ = cli_run(argv)
        assert rc == 0 and "\x1b" not in out and "\\x1b[2J\\nforged row" in out, out


def test_answer_strings_shown_or_used_as_paths_carry_no_control_characters():
    for key, line in [("disk.confirm_serial", 'confirm_serial = "S1\\u001b[2J"'),
                      ("disk.target", 'target = "/dev/disk/by-id/x\\u0000y"'),
                      ("root.password_hash", '[root]\npassword_hash = "$6$saltsalt$ab\\u001bcdefgh"'),
                      ("root.ssh_authorized_keys",
                       '[root]\nssh_authorized_keys = ["ssh-ed25519 AAAAC3Nza x\\u001b[2J"]')]:
        text = ANSWERS.replace('target = "/dev/disk/by-id/ata-DISK_1"', line) if key == "disk.target" else \
            ANSWERS + "\n" + line + "\n" if key.startswith("root") else \
            ANSWERS.replace("[network]", line + "\n\n[network]")
        problems = {p.key: p for p in answers_problems(text)}
        assert key in problems and "contains a" in problems[key].message, (key, [str(p) for p in problems.values()])


# ------------------------------------------------------------------------------------- paths
def test_a_by_id_path_with_dotdot_is_refused_before_and_after_normalising(tmp_path: Path):
    text = ANSWERS.replace("ata-DISK_1", "../../sda")
    (problem,) = answers_problems(text)
    assert problem.key == "disk.target" and "not a normalised path (it names /dev/sda)" in problem.message
    # check_answers applies the by-id rule to the normalised path, whatever built the answers
    valid = ans.parse_answers(ANSWERS, "a.toml")
    sneaky = valid.model_copy(update={"disk": valid.disk.model_copy(update={"target": "/dev/disk/by-id/../../sda"})})
    machine = Machine(disks=[], nics=[], by_id_dir="/dev/disk/by-id", cred_dirs=[])
    with pytest.raises(AnswerError) as e:
        ans.check_answers(sneaky, machine, "a.toml")
    assert "name the disk by its /dev/disk/by-id/ path" in str(e.value)


# ------------------------------------------------------------------------------------- addresses
@pytest.mark.parametrize(("address", "why"), [
    ("::ffff:127.0.0.1", "a loopback address (127.0.0.1)"),
    ("::ffff:224.0.0.251", "a multicast address (224.0.0.251)"),
    ("255.255.255.255", "the limited broadcast address"),
    ("::ffff:0.0.0.0", "the unspecified address"),
])
def test_frontend_address_forms_the_rules_refuse(address: str, why: str):
    text = ANSWERS.replace('role = "front-end"', 'role = "back-end"').replace(
        'campus_nic = "enp2s0"', f'frontend = "{address}"')
    problems = {p.key: p for p in answers_problems(text)}
    assert why in problems["network.frontend"].message


def test_a_mapped_frontend_address_is_stored_unwrapped():
    text = ANSWERS.replace('role = "front-end"', 'role = "back-end"').replace(
        'campus_nic = "enp2s0"', 'frontend = "::ffff:10.73.0.1"')
    assert ans.parse_answers(text, "a.toml").network.frontend == "10.73.0.1"


@pytest.mark.parametrize("address", ["198.18.0.1/24", "192.0.2.1/24", "240.0.0.1/24", "0.1.2.3/24",
                                     "100.64.0.1/24", "169.254.1.1/16", "127.0.0.1/8"])
def test_private_address_outside_the_documented_ranges(address: str):
    problems = answers_problems(ANSWERS + f'private_address = "{address}"\n')
    assert [p.message for p in problems] == ["not in a private range (10/8, 172.16/12, 192.168/16)"]


def test_private_address_without_a_prefix_says_so():
    (problem,) = answers_problems(ANSWERS + 'private_address = "10.73.0.1"\n')
    assert problem.message.startswith("no prefix given")


# ------------------------------------------------------------------------------------- weaker
def test_a_long_value_is_echoed_cut_with_its_length(tmp_path: Path, cli_run):
    text = ANSWERS.replace('hostname = "node1"', f'hostname = "{"x" * 500_000}"')
    rc, _, err = cli_run(["install", "--dry-run", "--answers", str(answer_file(tmp_path, text))])
    assert rc == 2 and "… (500000 characters)" in err and len(err) < 2000


def test_export_to_a_directory_leaves_nothing_behind(tmp_path: Path, cli_run):
    from cloudbox.core.record.results import ResultStore

    out = tmp_path / "exports"
    out.mkdir()
    ResultStore(tmp_path / "r.db").close()  # an empty store: --db names one that exists
    rc, _, err = cli_run(["results", "--db", str(tmp_path / "r.db"), "export", "-o", str(out)])
    assert rc == 2 and "is a directory" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exports", "profiles", "r.db", "r.db-shm", "r.db-wal"] \
        or not list(tmp_path.glob("*.tmp*")), list(tmp_path.iterdir())
    assert not list(tmp_path.glob("*tmp*")) and list(out.iterdir()) == []


def test_an_array_of_network_tables_gets_one_true_problem():
    text = ANSWERS.replace('role = "front-end"', 'role = "back-end"').replace("[network]", "[[network]]")
    problems = answers_problems(text)
    assert [p.key for p in problems] == ["network"] and problems[0].message == "must be a table"


def test_a_quoted_dotted_key_is_reported_for_what_it_is():
    problems = answers_problems('"disk.cache" = 1\n' + ANSWERS)
    assert [p.key for p in problems] == ['"disk.cache"']
    with pytest.raises(ProfileError) as e:
        profiles.parse_profile('"disk.cache" = "none"\n' + PRESET, "p.toml")
    assert '"disk.cache": unknown key' in str(e.value)


def test_profile_show_echoes_a_strange_name_quoted_and_intact(cli_run):
    rc, _, err = cli_run(["profile", "show", "x;rm -rf /"])
    assert rc == 2 and "'x;rm -rf /': no such profile file" in err
    rc, _, err = cli_run(["profile", "show", "x\x1b[2J"])
    assert rc == 2 and "no profile named 'x\\x1b[2J'" in err and "\x1b" not in err


def test_messages_show_no_python_forms(tmp_path: Path, cli_run):
    text = ANSWERS.replace('role = "front-end"', 'role = "back-end"').replace('campus_nic = "enp2s0"\n', "")
    err = str(AnswerError("a.toml", answers_problems(text)))
    assert "network.frontend: a back-end must know its front-end; allowed" in err and "None" not in err
    p = profile_file(tmp_path, "name = 'x'\ndescription = '\x80'\n".encode("latin-1").decode("latin-1"))
    p.write_bytes(b"name = 'x'\ndescription = '\x80'\n")
    rc, _, err = cli_run(["profile", "validate", str(p)])
    assert rc == 2 and "line 2: not UTF-8 text (got the bytes 0x80)" in err and "b'" not in err
    with pytest.raises(ProfileError) as e:
        profiles.parse_profile(PRESET.replace("vhost = false", "vhost = 1"), "p.toml")
    assert "True" not in str(e.value) and "(got 1)" in str(e.value)


def test_an_install_interrupted_before_writing_says_nothing_was_written(monkeypatch, tmp_path: Path, cli_run):
    from cloudbox.cli import install as cli_install

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_install, "probe_machine", interrupted)
    monkeypatch.setattr(cli_install, "reap_stale", lambda: None)
    rc, _, err = cli_run(["install", "--dry-run", "--answers", str(answer_file(tmp_path, ANSWERS))])
    assert rc == 130 and "nothing was written" in err and "What was written stays" not in err


def test_shown_never_gives_python_forms():
    assert inputs.shown(None) == "nothing" and inputs.shown(True) == "true" and inputs.shown(b"\x80") == \
        "the bytes 0x80"
    assert inputs.shown("it's") == '"it\'s"' and re.fullmatch(r"'a{80}… \(81 characters\)'", inputs.shown("a" * 81))
