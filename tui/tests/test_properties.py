"""Property-based tests (Hypothesis) over the profile and answer-file validators and their TOML entry points: for
any input the result is a valid object or a list of problems, never another exception, within a time and memory
bound; a valid profile's canonical TOML validates to the same hash.

The budget is fixed and the examples derandomized (the same ones every run, no example database), so the tests
are not flaky: EXAMPLES per property, about 10 s in all on the CI machine."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudbox.core import inputs
from cloudbox.core.errors import AnswerError, ProfileError
from cloudbox.core.install import answers as ans
from cloudbox.core.spec import knobs, profiles

EXAMPLES = 60
SECONDS = 2.0  # per example
PEAK_BYTES = 64 * 1024 * 1024  # per example

BUDGET = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def bounded(fn: Callable[[], Any], errors: tuple[type[Exception], ...]) -> Any:
    """fn() returns, or raises one of `errors` (whose problems are a non-empty list), within SECONDS and
    PEAK_BYTES; any other exception fails the test."""
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        result = fn()
    except errors as e:
        assert e.problems and all(str(p) for p in e.problems)  # type: ignore[attr-defined]
        result = e
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    took = time.monotonic() - t0
    assert took < SECONDS, f"took {took:.2f} s"
    assert peak < PEAK_BYTES, f"peak {peak / 2**20:.1f} MiB"
    return result


# -- values like those a TOML file or a form gives ---------------------------------------------------------
TRICKY = ["kvm", "xen", "virtio", "none", "/dev/sdb", "10.73.0.1", "discover", "back-end", "\x00", "\x1b[2J", "a\nb",
          "/dev/sd\x00a", "/dev/disk/by-id/../../sda", "::ffff:127.0.0.1", "::ffff:224.0.0.251", "255.255.255.255",
          "198.18.0.1/24", "192.0.2.1/24", "10.73.0.1", "10.73.0.1/24", "desc\x1b]0;x\x07", "enp1s0"]


def _nest(depth: int) -> Any:
    v: Any = 1
    for _ in range(depth):
        v = {"a": v}
    return v


scalars = st.one_of(st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=True),
                    st.text(max_size=50), st.sampled_from(TRICKY))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                      max_leaves=12) | st.integers(100, 3000).map(_nest)

PROFILE_KEYS = {"guest": ["hypervisor", "vcpus", "memory_mib"],
                "disk": ["bus", "cache", "io", "iothreads", "queues", "backing", "format", "volume"],
                "network": ["model", "vhost", "queues", "mtu"]}
ANSWER_KEYS = {"disk": ["target", "confirm_serial"],
               "network": ["private_nic", "campus_nic", "private_mtu", "frontend", "private_address"],
               "root": ["password_hash", "password_credential", "ssh_authorized_keys"]}


def documents(sections: dict[str, list[str]], top: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts shaped like the schema (known keys, sometimes unknown ones, any values), to reach past the first
    check."""
    section = {name: st.dictionaries(st.sampled_from(keys) | st.text(max_size=8), values, max_size=len(keys) + 1)
               for name, keys in sections.items()}
    return st.dictionaries(st.sampled_from(top + list(sections)) | st.text(max_size=8), values, max_size=6).flatmap(
        lambda d: st.fixed_dictionaries({k: section[k] if k in section else st.just(v) for k, v in d.items()}))


toml_lines = st.lists(st.one_of(
    st.builds(lambda k, v: f"{k} = {v}", st.sampled_from(["name", "description", "role", "hostname", "bus",
                                                          "a.b", '"x.y"', "vcpus"]),
              st.sampled_from(['"x"', "1", "true", "[1, [2]]", "{a = 1}", "1979-05-27", "0x1f", "1e999", "nan",
                               '"""a\nb"""', "'lit'", "[" * 40 + "]" * 40, "9" * 200, '"\\u0000"',
                               "[" * 3000 + "]" * 3000, "9" * 5000, "{a = " * 2000 + "1" + "}" * 2000])),
    st.sampled_from(["[guest]", "[disk]", "[network]", "[[network]]", "[root]", "[a.b.c]", "# c", "", "=", "[",
                     'x = "unterminated', "a" + ".a" * 3000 + " = 1"]),
    st.text(max_size=30)), max_size=12).map("\n".join)


@BUDGET
@given(documents(PROFILE_KEYS, ["name", "description", "reproduces"]))
def test_profile_validation_of_any_data_gives_a_profile_or_problems(data):
    result = bounded(lambda: profiles.validate_data(data, "p.toml"), (ProfileError,))
    assert isinstance(result, profiles.Profile | ProfileError)
    if isinstance(result, profiles.Profile):
        profile_holds_the_rules(result)


def profile_holds_the_rules(p: profiles.Profile) -> None:
    """What a valid profile never carries, whatever it was made from."""
    for text in (p.description, p.reproduces or "", p.disk.volume):
        assert inputs.control_chars(text) is None
    if p.disk.volume.startswith("/"):
        assert inputs.path_problem(p.disk.volume) is None


def answers_hold_the_rules(a: ans.Answers) -> None:
    """What valid answers never carry, whatever they were made from."""
    assert inputs.path_problem(a.disk.target) is None
    if a.network.frontend not in (None, "discover"):
        assert inputs.peer_address_problem(inputs.ip_address(a.network.frontend)) is None
    if a.network.private_address is not None:
        import ipaddress

        assert inputs.in_private_ranges(ipaddress.IPv4Interface(a.network.private_address).ip)
    for text in (a.disk.confirm_serial or "", a.root.password_hash or "", *a.root.ssh_authorized_keys):
        assert inputs.control_chars(text) is None


@BUDGET
@given(st.one_of(toml_lines, st.text(max_size=200)))
def test_profile_toml_entry_point_gives_a_profile_or_problems(text):
    result = bounded(lambda: profiles.parse_profile(text, "p.toml"), (ProfileError,))
    if isinstance(result, ProfileError):
        assert all(p.key for p in result.problems)
    else:
        profile_holds_the_rules(result)


@BUDGET
@given(documents(ANSWER_KEYS, ["role", "hostname", "after"]))
def test_answer_validation_of_any_data_gives_answers_or_problems(data):
    result = bounded(lambda: ans.validate_data(data, "a.toml"), (AnswerError,))
    assert isinstance(result, ans.Answers | AnswerError)
    if isinstance(result, ans.Answers):
        answers_hold_the_rules(result)


@BUDGET
@given(st.one_of(toml_lines, st.text(max_size=200)))
def test_answer_toml_entry_point_gives_answers_or_problems(text):
    result = bounded(lambda: ans.parse_answers(text, "a.toml"), (AnswerError,))
    if isinstance(result, ans.Answers):
        answers_hold_the_rules(result)


@BUDGET
@given(st.binary(max_size=300))
def test_the_input_layer_turns_any_bytes_into_text_or_one_problem(raw):
    def go() -> object:
        try:
            return inputs.load_toml(inputs.decode(raw))
        except inputs.InputProblem as e:
            assert e.where.startswith(("line ", "(file)"))
            return e
    bounded(go, ())


# -- round trip -------------------------------------------------------------------------------------------
one_line = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"), blacklist_characters="\u202a\u202b"
                                 "\u202c\u202d\u202e\u2066\u2067\u2068\u2069"), min_size=1, max_size=60).filter(
    lambda s: s.strip() != "")


@st.composite
def valid_profiles(draw) -> dict[str, Any]:
    """A profile that the cross-field rules accept, built from the allowed values."""
    hv = draw(st.sampled_from(["kvm", "xen"]))
    vcpus = draw(st.integers(1, 64))
    backing = draw(st.sampled_from(["sparse-file", "prealloc-file", "qcow2", "qcow2-prealloc", "block-device",
                                    "network-volume"]))
    # nvme is the host's own controller's bus only (backing nvme-pci, core.spec.iopaths), not drawn here
    bus = draw(st.sampled_from(knobs.XEN_BUSES if hv == "xen" else
                               [b for b in knobs.KVM_BUSES if b != knobs.NVME_BUS]))
    if hv == "xen":
        cache, io = knobs.xen_cache_mode(bus, backing), "threads"
        model = "xen-netfront" if bus == "xen-vbd" else draw(st.sampled_from(["e1000", "rtl8139", "xen-netfront"]))
    else:
        cache = draw(st.sampled_from(["none", "writethrough", "writeback", "directsync", "unsafe"]))
        io = draw(st.sampled_from(["native", "threads", "io_uring"] if cache in ("none", "directsync")
                                  else ["threads", "io_uring"]))
        model = draw(st.sampled_from(["e1000", "rtl8139", "virtio"]))
    virtio_disk = bus in knobs.VIRTIO_BUSES
    volume = {"block-device": draw(st.sampled_from(["", "/dev/sdb", "/dev/disk/by-id/ata-X"])),
              "network-volume": draw(st.sampled_from(["aoe:e1.0", "iscsi:iqn.2026-01.lab:t", "nbd:fe:10809"]))
              }.get(backing, "")
    queues = draw(st.integers(1, min(16, vcpus))) if virtio_disk else 1
    # several iothreads take the disk's queues between them (virtqueue mapping): virtio-blk, one queue each at least
    most = queues if bus == knobs.MAPPED_BUS else 1
    out: dict[str, Any] = {
        "name": draw(st.from_regex(r"[a-z0-9][a-z0-9-]{0,20}", fullmatch=True)),
        "description": draw(one_line),
        "guest": {"hypervisor": hv, "vcpus": vcpus, "memory_mib": draw(st.integers(256, 262144))},
        "disk": {"bus": bus, "cache": cache, "io": io, "backing": backing, "volume": volume,
                 "format": "qcow2" if backing in knobs.QCOW2_BACKINGS else "raw",
                 "iothreads": draw(st.integers(0, most)) if virtio_disk else 0,
                 "queues": queues},
        "network": {"model": model, "vhost": draw(st.booleans()) if model == "virtio" else False,
                    "queues": draw(st.integers(1, min(16, vcpus))) if model == "virtio" else 1,
                    "mtu": draw(st.integers(1500, 9000))},
    }
    if draw(st.booleans()):
        out["reproduces"] = draw(one_line)
    return out


@BUDGET
@given(valid_profiles())
def test_a_valid_profiles_canonical_toml_validates_to_the_same_hash(data):
    prof = bounded(lambda: profiles.validate_data(data, "generated"), ())
    again = bounded(lambda: profiles.parse_profile(prof.to_toml(), "canonical"), ())
    assert again.hash == prof.hash and again.to_toml() == prof.to_toml()
