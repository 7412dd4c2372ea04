"""A real image-propagation sweep (real libvirtd and QEMU, TCG here) through `cloudbox study run`: two small image
sizes, one sample each, each a source image copied to a fresh instance file, a guest booted on it to its agent and
destroyed; the samples stored as a propagation run, the sweep resumable (nothing left to run), the report's section
and fit, and nothing left behind: no guest, no work directory, no cut source image, and the store emptied by
`cloudbox study images --clear`."""

from __future__ import annotations

import platform

import pytest
from real_runs import leftovers, work_files

from cloudbox.core.bench import propagation
from cloudbox.core.record.events import StateEvent
from cloudbox.core.record.results import ResultStore
from cloudbox.core.spec import profiles
from cloudbox.core.spec.runspec import MIB, PlanStep

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.full]

PROFILE = "kvm-cache-writethrough"
SWEEP = f"""\
name = "p"
title = "Image propagation"
description = "A guest provisioned from images of two sizes."
sizes = ["quick"]

[[profiles]]
name = "{PROFILE}"
row = "KVM, raw file"

[[tests]]
id = "dd-write-64k"
table = "Writes"

[propagation]
profile = "{PROFILE}"

[propagation.quick]
sizes_mib = [32, 64]
repeats = 1

[plan.quick]
repeats = 1  # the one-sample cell stored below counts: the study run is the sweep alone
"""


def test_the_quick_sweep_provisions_a_guest_per_size_and_leaves_nothing(state, libvirt_conn, tmp_path, monkeypatch,
                                                                         cli_run):
    studies = tmp_path / "studies"
    studies.mkdir()
    (studies / "p.toml").write_text(SWEEP)
    monkeypatch.setenv("CLOUDBOX_STUDY_DIR", str(studies))
    prof = profiles.find_profile(PROFILE)
    with ResultStore() as store:  # the study's one cell is stored already, so the study run is the sweep alone
        cell = store.create_run(profile_name=PROFILE, profile_hash=prof.hash, profile_toml=prof.to_toml(),
                                suite="storage", size_label="quick", accelerator="kvm", node=platform.node())
        for side in ("baseline", "guest"):
            store.add_measurement(cell, side=side, test="dd-write-64k", metric="MB/s", value=100.0)
        store.finish_run(cell, "completed")

    ran = cli_run(["study", "run", "p", "--size", "quick"])
    code, out = ran.code, ran.printed
    assert code == 0, out
    assert f"propagation sweep ({PROFILE}): run 2 sample(s); stored 32 MiB 0 of 1, 64 MiB 0 of 1" in out
    assert f"run 1 of 1: {PROFILE} (image-propagation sweep, 2 samples)" in out
    with ResultStore() as store:
        [run] = [store.get_run(r.id) for r in store.list_runs() if r.suite == "propagation"]
        events = [e.record for e in store.events_since(run.id, 0)]
    assert run.state == "completed", run.reason
    first = events[0]
    texts = [getattr(e, "text", "") for e in events]  # the progress lines the foreground run printed
    assert "propagation: 32 MiB image, sample 1 of 1" in texts
    assert any(t.startswith("making the source image of 64 MiB") for t in texts)
    assert any(t.startswith("64 MiB: copy ") and "boot to agent" in t for t in texts)
    assert isinstance(first, StateEvent) and first.plan == (PlanStep("guest", "propagate-32m#1"),
                                                            PlanStep("guest", "propagate-64m#1"))
    samples = propagation.samples_of(run)
    assert sorted(x.size_bytes for x in samples) == [32 * MIB, 64 * MIB]
    for x in samples:
        assert x.copy_s > 0 and x.boot_s > 0
        assert x.copy_s + x.boot_s - 1e-6 <= x.total_s < x.copy_s + x.boot_s + 1.0  # the copy's start to the agent
        assert ("emulated" in x.qualifiers) == (run.accelerator == "tcg") and "quick" in x.qualifiers
    assert run.size_bytes == 64 * MIB and run.provenance.backing is not None
    assert run.provenance.backing.kind == "instance-copy" and "<domain" in (run.provenance.domain_xml or "")

    # nothing left behind: no guest, no work directory (instance copies), no cut source image
    assert leftovers(libvirt_conn, state) == {"guests": [], "bridge": False, "netns": False, "loops": []}
    assert work_files(state) == []
    assert [(x.size_bytes, x.complete) for x in propagation.list_sources()] == [(32 * MIB, True), (64 * MIB, True)]

    ran = cli_run(["study", "run", "p", "--size", "quick"])  # resumable: every sample is stored
    code, out = ran.code, ran.printed
    assert code == 0, out
    assert "0 run(s) to do" in out and "nothing to run; stored 32 MiB 1 of 1, 64 MiB 1 of 1" in out

    ran = cli_run(["study", "report", "p"])
    code, out = ran.code, ran.printed
    assert code == 0, out
    section = out.split("## Propagation", 1)[1]
    assert "| 32 MiB | 1 of 1 |" in section and "| 64 MiB | 1 of 1 |" in section
    assert "- n: 2 samples at 2 image sizes" in section
    if run.accelerator == "tcg":
        assert "Fitted line (emulated, quick" in section

    ran = cli_run(["study", "images", "--clear"])
    code, out = ran.code, ran.printed
    assert code == 0 and "removed 2 source image(s)" in out
    assert propagation.list_sources() == []
