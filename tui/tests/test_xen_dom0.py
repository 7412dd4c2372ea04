"""A Xen profile's [dom0] knobs: validated as profile data, set with xl before the run, recorded in its provenance,
restored after it, and refused with the boot parameter to use when dom0's memory cannot change at run time.

`xl` exists only on the Xen boot, so these tests put an executable `xl` in its place that keeps dom0's state in a
JSON file and prints it in xl's formats; the appliance's Xen boot runs the real one (tests/image/xen.bats, full tier).
"""

from __future__ import annotations

import contextlib
import json
import sys
import types

import pytest

from cloudbox.core.errors import CloudboxError
from cloudbox.core.record.provenance import Provenance
from cloudbox.core.run import local
from cloudbox.core.spec import profiles
from cloudbox.core.virt import xendom0

FAKE_XL = r'''
import json, sys
state_file = __STATE__
st = json.load(open(state_file))
args = sys.argv[1:]
st["calls"].append(" ".join(args))
def save():
    json.dump(st, open(state_file, "w"))
save()
if args == ["info"]:
    print(f"host : dom0\nnr_cpus : {st['nr_cpus']}\nxen_version : 4.20.2")
elif args == ["list", "Domain-0"]:
    print("Name ID Mem VCPUs State Time(s)")
    print(f"Domain-0 0 {st['mem']} {len(st['aff'])} r----- 12.0")
elif args == ["vcpu-list", "Domain-0"]:
    print("Name                                ID  VCPU   CPU State   Time(s) Affinity (Hard / Soft)")
    for v, (hard, soft) in enumerate(st["aff"]):
        print(f"Domain-0                             0     {v}    {v}   -b-       5.1  {hard} / {soft}")
elif args[:2] == ["vcpu-pin", "Domain-0"]:
    vcpus = range(len(st["aff"])) if args[2] == "all" else [int(args[2])]
    for v in vcpus:
        st["aff"][v] = [args[3], args[4] if len(args) > 4 else st["aff"][v][1]]
    save()
elif args[:2] == ["mem-set", "Domain-0"]:
    st["mem"] = min(int(args[2].rstrip("m")), st["max"])  # the balloon stops at dom0's maximum
    save()
else:
    sys.exit(f"fake xl: unknown {args}")
'''


@pytest.fixture
def xl(tmp_path):
    """An `xl` over a dom0 of 2 vCPUs (both unpinned), 2048 MiB of at most 3072, on a 4-CPU host."""
    state = tmp_path / "dom0.json"
    state.write_text(json.dumps({"nr_cpus": 4, "mem": 2048, "max": 3072, "aff": [["all", "all"], ["all", "all"]],
                                 "calls": []}))
    script = tmp_path / "xl"
    script.write_text(f"#!{sys.executable}\n" + FAKE_XL.replace("__STATE__", repr(str(state))))
    script.chmod(0o755)
    return types.SimpleNamespace(path=str(script), state=lambda: json.loads(state.read_text()))


def _xen(dom0: str) -> profiles.Profile:
    text = profiles.find_profile("xen-xvd-phy").to_toml().split("\n[dom0]")[0]
    return profiles.parse_profile(text + "\n[dom0]\n" + dom0)


def _ctx(profile, tmp_path):
    """The parts of a run context tune_dom0 touches: the profile, the Xen accelerator, the stack, sink and control."""
    logs: list[str] = []
    saved: list[Provenance] = []
    ctx = types.SimpleNamespace(
        profile=profile, dom0=True, stack=contextlib.ExitStack(), provenance=Provenance(),
        control=types.SimpleNamespace(atomic=contextlib.nullcontext, cancelled=lambda: False),
        sink=types.SimpleNamespace(step=logs.append, log=logs.append), logs=logs)
    ctx.save_provenance = lambda: saved.append(ctx.provenance.model_copy())
    return ctx


def test_knobs_are_xen_only_validated_and_hashed_only_when_set():
    kvm = profiles.find_profile("virtio-disk")
    assert "dom0" not in kvm.to_toml() and not any(k.startswith("dom0.") for k in kvm.knobs())
    with pytest.raises(profiles.ProfileError) as e:
        profiles.parse_profile(kvm.to_toml() + "\n[dom0]\nvcpu_pin = \"0\"\n")
    assert "dom0.vcpu_pin: dom0 is Xen's control domain; a KVM host has none" in str(e.value)
    for bad, key, allowed in (('vcpu_pin = "2-1"', "dom0.vcpu_pin", "0, 0-1, 0,2"),
                              ('vcpu_pin = "cpu0"', "dom0.vcpu_pin", "0, 0-1, 0,2"),
                              ("memory_mib = 128", "dom0.memory_mib", "512..262144"),
                              ("memory_mib = \"1G\"", "dom0.memory_mib", None)):
        with pytest.raises(profiles.ProfileError) as e:
            _xen(bad)
        assert [p.key for p in e.value.problems] == [key]
        assert allowed is None or allowed in str(e.value)
    plain = profiles.find_profile("xen-xvd-phy")
    assert _xen("").hash == plain.hash  # an empty [dom0] is the profile without it
    tuned = _xen('vcpu_pin = "0"\nmemory_mib = 1024')
    assert tuned.hash != plain.hash and "dom0: vCPUs pinned to 0, 1024 MiB" in tuned.describe()
    assert profiles.diff_profiles(plain, tuned) == [("dom0.vcpu_pin", "", "0"), ("dom0.memory_mib", 0, 1024)]
    assert profiles.parse_profile(tuned.to_toml()) == tuned


def test_set_recorded_and_restored_after_success_and_failure(xl, tmp_path):
    for ending in (None, KeyboardInterrupt()):
        ctx = _ctx(_xen('vcpu_pin = "1"\nmemory_mib = 1024'), tmp_path)
        with contextlib.suppress(KeyboardInterrupt), ctx.stack:
            local.tune_dom0(ctx, xl=xl.path)  # type: ignore[arg-type]
            st = xl.state()
            assert (st["mem"], st["aff"]) == (1024, [["1", "all"], ["1", "all"]])
            rec = ctx.provenance.dom0
            assert (rec.vcpu_pin, rec.memory_before_mib, rec.memory_mib) == ("1", 2048, 1024)
            assert rec.affinity_before == ["0: all / all", "1: all / all"]
            if ending is not None:
                raise ending
        st = xl.state()
        assert (st["mem"], st["aff"]) == (2048, [["all", "all"], ["all", "all"]]), f"not restored after {ending!r}"
        assert ctx.logs[-1] == "dom0 restored: memory 2048 MiB; vCPU affinity 0: all / all, 1: all / all"


def test_memory_past_dom0s_maximum_is_refused_with_the_boot_parameter(xl, tmp_path, monkeypatch):
    monkeypatch.setattr(xendom0, "BALLOON_WAIT_S", 0.0)
    ctx = _ctx(_xen('vcpu_pin = "0-1"\nmemory_mib = 3584'), tmp_path)
    with pytest.raises(CloudboxError) as e, ctx.stack:
        local.tune_dom0(ctx, xl=xl.path)  # type: ignore[arg-type]
    msg = str(e.value)
    assert "dom0.memory_mib = 3584: dom0 stayed at 3072 MiB" in msg
    assert "dom0_mem=3584M,max:3584M" in msg
    st = xl.state()
    assert (st["mem"], st["aff"]) == (2048, [["all", "all"], ["all", "all"]])  # the pinning undone too


def test_a_cpu_the_host_lacks_is_refused_before_anything_changes(xl, tmp_path):
    ctx = _ctx(_xen('vcpu_pin = "2-5"'), tmp_path)
    with pytest.raises(CloudboxError, match=r"dom0.vcpu_pin = '2-5': this host has physical CPUs 0..3"), ctx.stack:
        local.tune_dom0(ctx, xl=xl.path)  # type: ignore[arg-type]
    assert xl.state()["calls"] == ["info"]


def test_nothing_is_done_without_knobs_or_off_xen(xl, tmp_path):
    for prof, dom0 in ((profiles.find_profile("xen-xvd-phy"), True), (_xen('memory_mib = 1024'), False)):
        ctx = _ctx(prof, tmp_path)
        ctx.dom0 = dom0
        local.tune_dom0(ctx, xl=xl.path)  # type: ignore[arg-type]
        assert ctx.provenance.dom0 is None
    assert xl.state()["calls"] == []


def test_parsers_read_xls_own_output():
    text = """Name                                ID  VCPU   CPU State   Time(s) Affinity (Hard / Soft)
Domain-0                             0     0    0   r--      25.6  all / all
Domain-0                             0     1    1   -b-      20.1  0-1 / 1
"""
    assert xendom0.parse_vcpu_list(text) == [xendom0.VcpuAffinity(0, "all", "all"),
                                             xendom0.VcpuAffinity(1, "0-1", "1")]
    assert xendom0.parse_list_memory("Name ID Mem VCPUs State Time(s)\nDomain-0 0 1833 2 r----- 80.4\n") == 1833
    assert xendom0.parse_list_memory("") is None
