"""Study B's image-propagation sweep without a guest: the least-squares fit against hand-computed values, the study
file's [propagation] table refused naming file, key, value and what is allowed, the sweep planned from stored
samples (resumable, round by round), the report's Propagation section and its plot from stored runs (the fewer-than-
two-sizes case and the emulated and nested labels included), the free-space refusal, the source images and the copy,
the propagation run's spec, and the results database's upgrade to schema 3."""

from __future__ import annotations

import os
import platform
import sqlite3
import subprocess
from pathlib import Path
from types import SimpleNamespace
from xml.etree import ElementTree

import pytest

from cloudbox import cli
from cloudbox.core.bench import propagation
from cloudbox.core.bench.propagation import NoFit, Sample
from cloudbox.core.disks import backing
from cloudbox.core.errors import NoSpace, StudyError, UsageError
from cloudbox.core.inputs import shown
from cloudbox.core.record import schema
from cloudbox.core.record.results import ResultStore
from cloudbox.core.spec import profiles
from cloudbox.core.spec.runspec import MIB, PlanStep, RunSpec
from cloudbox.core.studies import evidence, imagesweep, loading, planning
from cloudbox.core.studies.loading import parse_study
from cloudbox.core.virt.guestimage import GuestImage

REPO = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000.0
PROFILE = "kvm-cache-writethrough"
SVG = "{http://www.w3.org/2000/svg}"


pytestmark = pytest.mark.usefixtures("isolated")


def sample(gb: float, total: float, run_id: int = 1) -> Sample:
    return Sample(run_id, int(gb * 1e9), copy_s=0.0, boot_s=total, total_s=total)


# ---------------------------------------------------------------------------------------------------- the fit
def test_fit_of_an_exact_line():
    """total = 1 s + 2 s/GB x size: 2 s per GB is 500 MB/s, and the line explains everything."""
    line = propagation.fit([sample(1, 3.0), sample(2, 5.0), sample(3, 7.0)])
    assert line.intercept_s == pytest.approx(1.0) and line.slope_s_per_gb == pytest.approx(2.0)
    assert line.mbps == pytest.approx(500.0) and line.r2 == pytest.approx(1.0)
    assert (line.n, line.sizes) == (3, 3)
    assert line.at(4.0) == pytest.approx(9.0)


def test_fit_through_scattered_repeats_against_hand_computed_values():
    """x = 1, 1, 2, 2 GB; y = 2, 4, 5, 7 s. Means 1.5 and 4.5; Sxy = 1.25 + 0.25 + 0.25 + 1.25 = 3; Sxx = 4 x 0.25 = 1;
    Syy = 6.25 + 0.25 + 0.25 + 6.25 = 13. Slope 3 s/GB (333.3 MB/s), intercept 4.5 - 3 x 1.5 = 0, R² = 9 / 13."""
    line = propagation.fit([sample(1, 2.0), sample(1, 4.0), sample(2, 5.0), sample(2, 7.0)])
    assert line.slope_s_per_gb == pytest.approx(3.0)
    assert line.intercept_s == pytest.approx(0.0, abs=1e-12)
    assert line.mbps == pytest.approx(1000 / 3)
    assert line.r2 == pytest.approx(9 / 13)
    assert (line.n, line.sizes) == (4, 2)


def test_no_line_below_two_sizes_and_no_rate_from_a_flat_line():
    with pytest.raises(NoFit, match=r"^no samples; a line needs samples at two sizes at least$"):
        propagation.fit([])
    one = [Sample(1, 64 * MIB, 1.0, 5.0, 6.0), Sample(2, 64 * MIB, 1.0, 6.0, 7.0)]
    with pytest.raises(NoFit, match=r"^the samples cover one image size \(64 MiB\); a line needs samples at two "):
        propagation.fit(one)
    flat = propagation.fit([sample(1, 5.0), sample(2, 5.0)])
    assert flat.slope_s_per_gb == pytest.approx(0.0) and flat.mbps is None and flat.r2 is None


# ---------------------------------------------------------------------------------------------- the study file
GOOD = """\
name = "t"
title = "A sweep"
description = "Provisioning from images of growing size."
sizes = ["study", "quick"]

[[profiles]]
name = "kvm-cache-writethrough"
row = "KVM, raw file"

[[profiles]]
name = "xen-default"
row = "Xen, raw file"

[[tests]]
id = "dd-write-64k"
table = "Writes"

[propagation]
profile = "kvm-cache-writethrough"

[propagation.study]
sizes_mib = [512, 1024, 1536]
repeats = 10

[propagation.quick]
sizes_mib = [32, 64, 128]
repeats = 2
"""


def replace(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def test_the_shipped_study_b_and_the_good_file_have_their_sweep():
    b = loading.find_study("b")
    assert b.propagation is not None and b.propagation.profile == PROFILE
    study, quick = b.sweep_plan("study"), b.sweep_plan("quick")
    assert study is not None and study.sizes_mib == [512, 1024, 1536, 2048, 2560, 3072, 3584] and study.repeats == 10
    assert quick is not None and quick.sizes_mib == [32, 64, 128] and quick.repeats == 2
    t = parse_study(GOOD, "t.toml")
    assert t.sweep_plan("quick").sizes == [32 * MIB, 64 * MIB, 128 * MIB]  # type: ignore[union-attr]


SWEEP_INVALID = [
    ("sizes-descending", replace(GOOD, "sizes_mib = [512, 1024, 1536]", "sizes_mib = [1024, 512]"),
     "propagation.study.sizes_mib", [1024, 512], "ascending"),
    ("size-twice", replace(GOOD, "sizes_mib = [32, 64, 128]", "sizes_mib = [32, 32]"),
     "propagation.quick.sizes_mib", [32, 32], "ascending"),
    ("size-too-small", replace(GOOD, "sizes_mib = [32, 64, 128]", "sizes_mib = [2, 64]"),
     "propagation.quick.sizes_mib[1]", 2, "each 4..1048576"),
    ("size-not-whole", replace(GOOD, "sizes_mib = [32, 64, 128]", "sizes_mib = [32.5, 64]"),
     "propagation.quick.sizes_mib[1]", 32.5, "image sizes in MiB"),
    ("no-sizes", replace(GOOD, "sizes_mib = [32, 64, 128]", "sizes_mib = []"),
     "propagation.quick.sizes_mib", [], "1..16 image sizes"),
    ("sizes-a-string", replace(GOOD, "sizes_mib = [32, 64, 128]", 'sizes_mib = "32,64"'),
     "propagation.quick.sizes_mib", "32,64", "image sizes in MiB"),
    ("repeats-zero", replace(GOOD, "repeats = 2", "repeats = 0"),
     "propagation.quick.repeats", 0, "samples per image size, 1..100"),
    ("repeats-too-many", replace(GOOD, "repeats = 10", "repeats = 101"),
     "propagation.study.repeats", 101, "samples per image size, 1..100"),
    ("repeats-missing", replace(GOOD, "repeats = 10\n", ""),
     "propagation.study.repeats", None, "samples per image size"),
    ("profile-outside-the-matrix", replace(GOOD, 'profile = "kvm-cache-writethrough"', 'profile = "virtio-disk"'),
     "propagation.profile", "virtio-disk", "kvm-cache-writethrough, xen-default"),
    ("profile-not-runnable", replace(GOOD, 'profile = "kvm-cache-writethrough"', 'profile = "xen-default"'),
     "propagation.profile", "xen-default", "whose guest cloudbox launches (KVM) on a raw disk"),
    ("plan-missing-for-a-size", replace(GOOD, "[propagation.quick]\nsizes_mib = [32, 64, 128]\nrepeats = 2\n", ""),
     "propagation.quick", None, "a table with keys sizes_mib, repeats"),
    ("plan-for-a-size-not-offered", replace(GOOD, 'sizes = ["study", "quick"]', 'sizes = ["study"]'),
     "propagation.quick", "quick", "sizes: study"),
    ("unknown-key", replace(GOOD, "repeats = 2", "repeats = 2\nevery_minutes = 5"),
     "propagation.quick.every_minutes", 5, "known keys: sizes_mib, repeats"),
    ("unknown-size-table", GOOD + "\n[propagation.huge]\nsizes_mib = [1]\nrepeats = 1\n",
     "propagation.huge", {"sizes_mib": [1], "repeats": 1}, "known keys: profile, study, quick"),
]


@pytest.mark.parametrize(("text", "key", "value", "allowed"), [c[1:] for c in SWEEP_INVALID],
                         ids=[c[0] for c in SWEEP_INVALID])
def test_a_bad_propagation_table_names_file_key_value_and_what_is_allowed(text, key, value, allowed):
    with pytest.raises(StudyError) as exc_info:
        parse_study(text, "studies/t.toml", expect_name="t")
    err = exc_info.value
    by_key = {p.key: p for p in err.problems}
    assert key in by_key, f"no problem for {key}: {err}"
    problem = by_key[key]
    assert problem.value == value and type(problem.value) is type(value)
    assert problem.allowed and allowed in problem.allowed, problem.allowed
    text_of_err = str(err)
    assert text_of_err.startswith("studies/t.toml: invalid study")
    assert f"{key}: " in text_of_err and allowed in text_of_err
    assert value is None or shown(value) in text_of_err


def test_a_bad_study_file_on_disk_is_refused_by_the_cli_naming_the_file(tmp_path, monkeypatch, cli_run):
    d = tmp_path / "studies"
    d.mkdir()
    f = d / "t.toml"
    f.write_text(replace(GOOD, "repeats = 10", "repeats = 0"))
    monkeypatch.setenv("CLOUDBOX_STUDY_DIR", str(d))
    code, _, err = cli_run(["study", "run", "t", "--dry-run"])
    assert code == 2
    assert err.startswith(f"cloudbox: {f}: invalid study (1 problem)")
    assert "propagation.study.repeats" in err and "(got 0)" in err and "1..100" in err


# ------------------------------------------------------------------------------------------- stored samples
def add_sweep(store: ResultStore, samples: list[tuple[int, float, float]], *, size: str = "study",
              accelerator: str = "kvm", state: str = "completed", reason: str | None = None,
              started_at: float = T0, profile_hash: str | None = None) -> int:
    """A propagation run holding (image MiB, copy s, boot s) samples, stored as the executor stores them."""
    prof = profiles.find_profile(PROFILE)
    rid = store.create_run(profile_name=PROFILE, profile_hash=profile_hash or prof.hash,
                           profile_toml=prof.to_toml(), suite="propagation", size_label=size, accelerator=accelerator,
                           started_at=started_at, node=platform.node())
    for i, (mib, copy, boot) in enumerate(samples):
        t = started_at + 60 * i
        for metric, value in (("copy_s", copy), ("boot_s", boot), ("total_s", copy + boot)):
            store.add_measurement(rid, side="guest", test=f"propagate-{mib}m", metric=metric, value=value,
                                  labels=["quick-size"] if size == "quick" else [], started_at=t, finished_at=t + 9)
    store.finish_run(rid, state, reason)
    return rid


@pytest.fixture
def study_runs() -> dict[str, int]:
    """Study B at study size on KVM: a completed run (512 and 1024 MiB twice), then a run stopped by Ctrl-C after one
    1536 MiB sample, and a run of an older version of the profile whose samples the plan does not count."""
    with ResultStore() as store:
        return {
            "done": add_sweep(store, [(512, 2.0, 6.0), (1024, 4.0, 6.0), (512, 2.2, 6.2), (1024, 4.4, 6.0)]),
            "cut": add_sweep(store, [(1536, 6.0, 6.0)], state="aborted", reason="cancelled by SIGINT\nconsole tail",
                             started_at=T0 + 1000),
        }


def test_samples_read_back_whole_and_a_cut_run_keeps_its_own(study_runs):
    with ResultStore() as store:
        done = propagation.samples_of(store.get_run(study_runs["done"]))
        cut = propagation.samples_of(store.get_run(study_runs["cut"]))
    assert [(x.size_bytes // MIB, x.copy_s, x.boot_s, x.total_s) for x in done] == [
        (512, 2.0, 6.0, 8.0), (1024, 4.0, 6.0, 10.0), (512, 2.2, 6.2, 8.4), (1024, 4.4, 6.0, 10.4)]
    assert [(x.size_bytes // MIB, x.total_s) for x in cut] == [(1536, 12.0)]
    assert done[0].copy_mbps == pytest.approx(512 * MIB / 2.0 / 1e6) and done[0].qualifiers == []


def test_the_report_section_against_hand_computed_values(study_runs, cli_run):
    code, report, _ = cli_run(["study", "report", "b"])
    assert code == 0
    section = report.split("## Propagation", 1)[1].split("\n## ", 1)[0]
    rows = section.splitlines()
    d, c = study_runs["done"], study_runs["cut"]
    # 512 MiB: totals 8.0, 8.4 (median, mean 8.2); copies 2.0, 2.2 (median 2.1: 255.7 MB/s); boots 6.0, 6.2
    assert f"| 512 MiB | 2 of 10 | 8.20 | 8.20 | 2.10 | 6.10 | 256 | #{d} |" in rows
    assert f"| 1 GiB | 2 of 10 | 10.20 | 10.20 | 4.20 | 6.00 | 256 | #{d} |" in rows
    assert f"| 1536 MiB | 1 of 10 | 12.00 | 12.00 | 6.00 | 6.00 | 268 | #{c} |" in rows
    xs = [512 * MIB / 1e9] * 2 + [1024 * MIB / 1e9] * 2 + [1536 * MIB / 1e9]
    ys = [8.0, 8.4, 10.0, 10.4, 12.0]
    mx, my = sum(xs) / 5, sum(ys) / 5
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    syy = sum((y - my) ** 2 for y in ys)
    slope = sxy / sxx
    intercept = my - slope * mx
    assert f"- total = {intercept:.2f} s + {slope:.3g} s/GB × size" in section
    assert f"- slope: {slope:.3g} s per GB, that is {1000 / slope:.0f} MB/s" in section
    assert f"- R²: {sxy ** 2 / (sxx * syy):.3f}" in section
    assert "- n: 5 samples at 3 image sizes" in section
    assert "(emulated" not in section and "Fitted line, least squares over every sample (sizes in GB" in section
    # the runs it used, the cut one saying how it ended (its reason's first line only)
    assert f"- run #{d}: image-propagation sweep of `{PROFILE}`, study size, kvm, node " in report
    assert (f"- run #{c}: image-propagation sweep of `{PROFILE}`, study size, kvm, node {platform.node()}, started "
            in report)
    assert ", aborted (cancelled by SIGINT): the samples it stored before count" in report
    assert "console tail" not in report


def test_one_size_is_no_fit_and_emulated_and_nested_samples_say_so(cli_run):
    with ResultStore() as store:
        tcg = add_sweep(store, [(32, 0.5, 40.0), (32, 0.7, 44.0)], size="quick", accelerator="tcg")
    code, report, _ = cli_run(["study", "report", "b", "--size", "quick"])
    assert code == 0
    section = report.split("## Propagation", 1)[1].split("\n## ", 1)[0]
    assert f"| 32 MiB | 2 of 2 | 42.60 (emulated, quick) | 42.60 | 0.60 | 42.00 | 55.9 | #{tcg} |" in section
    assert ("No line is fitted: the samples cover one image size (32 MiB); a line needs samples at two sizes at "
            "least.") in section
    assert "At quick size the images are a few dozen MiB" in section
    assert "(emulated): measured under TCG emulation" in report and "TCG (emulated)" in report
    with ResultStore() as store:
        add_sweep(store, [(64, 0.9, 30.0), (128, 1.5, 31.0)], size="quick", accelerator="nested-kvm",
                  started_at=T0 + 500)
    code, report, _ = cli_run(["study", "report", "b", "--size", "quick"])
    section = report.split("## Propagation", 1)[1].split("\n## ", 1)[0]
    assert "| 64 MiB | 1 of 2 | 30.90 (nested, quick) |" in section
    assert "Fitted line (nested, emulated, quick), least squares over every sample" in section  # both kinds
    assert "- n: 4 samples at 3 image sizes" in section


def test_no_samples_yet(cli_run):
    code, report, _ = cli_run(["study", "report", "b"])
    assert code == 0 and "## Propagation" in report and "No samples stored yet (`cloudbox study run b`)." in report
    code, report, _ = cli_run(["study", "report", "a"])
    assert "## Propagation" not in report  # a study without a sweep has no such section


def test_the_html_report_plots_every_sample_and_the_line(study_runs, tmp_path, cli_run):
    page = tmp_path / "b.html"
    code, _, err = cli_run(["study", "report", "b", "-o", str(page)])
    assert code == 0 and "5 propagation samples" in err
    html = page.read_text()
    assert "<h2>Propagation</h2>" in html and "<table>" in html.split("<h2>Propagation</h2>", 1)[1]
    start = html.index("<svg", html.index("<h2>Propagation</h2>"))
    svg = ElementTree.fromstring(html[start:html.index("</svg>", start) + len("</svg>")])
    assert svg.find(f"{SVG}title").text == f"{PROFILE}: total seconds against image size"  # type: ignore[union-attr]
    dots = svg.findall(f"{SVG}circle")
    assert len(dots) == 5
    assert [d.find(f"{SVG}title").text.split(",")[0] for d in dots[:3]] == [  # type: ignore[union-attr]
        f"run #{study_runs['done']}: 512 MiB", f"run #{study_runs['done']}: 512 MiB",
        f"run #{study_runs['done']}: 1 GiB"]
    [line] = [x for x in svg.findall(f"{SVG}line") if x.get("stroke") == "#b03a2e"]
    assert line.find(f"{SVG}title").text.startswith("fit: ")  # type: ignore[union-attr]


def test_the_html_plot_of_emulated_samples_says_so(tmp_path, cli_run):
    with ResultStore() as store:
        add_sweep(store, [(32, 0.5, 40.0), (64, 0.7, 44.0)], size="quick", accelerator="tcg")
    page = tmp_path / "b.html"
    assert cli_run(["study", "report", "b", "-o", str(page)])[0] == 0
    html = page.read_text()
    start = html.index("<svg", html.index("<h2>Propagation</h2>"))
    svg = ElementTree.fromstring(html[start:html.index("</svg>", start) + len("</svg>")])
    assert svg.find(f"{SVG}title").text.endswith("(emulated, quick)")  # type: ignore[union-attr]
    assert all("(emulated, quick)" in d.find(f"{SVG}title").text for d in svg.findall(f"{SVG}circle"))  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------------- the plan
def test_the_plan_resumes_round_by_round_and_counts_a_cut_run(study_runs):
    b = loading.find_study("b")
    with ResultStore() as store:
        add_sweep(store, [(512, 1.0, 5.0)] * 3, profile_hash="an older profile")  # not the profile as it is today
        runs = store.list_runs()
    hashes, unavailable = evidence.profile_facts(b)
    sweep = imagesweep.plan_sweep(b, runs, hashes, size="study", node=platform.node(), backend=False,
                               unavailable=unavailable)
    assert sweep is not None and sweep.refused is None
    assert {k // MIB: v for k, v in sweep.have.items()} == {512: 2, 1024: 2, 1536: 1}
    assert len(sweep.todo) == 70 - 5
    assert [x // MIB for x in sweep.todo[:9]] == [512, 1024, 1536, 2048, 2560, 3072, 3584, 512, 1024]
    assert [x // MIB for x in sweep.todo[-2:]] == [3072, 3584]  # the last round: the sizes with nothing stored
    spec = sweep.spec("study", work_dir="/srv/w", device="/dev/sdx", destroy="sdx", agent_timeout=90.0)
    assert (spec.suite, spec.size, spec.work_dir, spec.device, spec.agent_timeout) == (
        "propagation", "study", "/srv/w", "", 90.0)
    spec.validate()
    assert spec.plan()[:3] == [PlanStep("guest", "propagate-512m#1"), PlanStep("guest", "propagate-1024m#1"),
                               PlanStep("guest", "propagate-1536m#1")]
    again = imagesweep.plan_sweep(b, runs, hashes, size="study", node=platform.node(), backend=False, again=True)
    assert again is not None and len(again.todo) == 70
    elsewhere = imagesweep.plan_sweep(b, runs, hashes, size="study", node="n1", backend=True)
    assert elsewhere is not None and not elsewhere.todo and "runs on this host only" in (elsewhere.refused or "")


def test_study_run_plans_the_sweep_after_the_cells_and_skips_it_when_stored(cli_run, monkeypatch):
    code, out, _ = cli_run(["study", "run", "b", "--size", "quick", "--dry-run"])
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "study b at quick size on this host: 3 run(s) to do"
    assert lines[-1] == (f"  propagation sweep ({PROFILE}): run 6 sample(s); stored 32 MiB 0 of 2, 64 MiB 0 of 2, "
                         "128 MiB 0 of 2")
    with ResultStore() as store:
        add_sweep(store, [(32, 0.1, 5.0), (64, 0.2, 5.0), (128, 0.3, 5.0)] * 2, size="quick")
        todo = planning.prepare_run(loading.find_study("b"), store.list_runs(), size="quick")
    assert [s.suite for s in todo.specs] == ["storage", "storage"]  # the sweep is whole: no propagation run
    code, out, _ = cli_run(["study", "run", "b", "--size", "quick", "--dry-run"])
    assert out.splitlines()[-1] == (f"  propagation sweep ({PROFILE}): nothing to run; stored 32 MiB 2 of 2, 64 MiB "
                                    "2 of 2, 128 MiB 2 of 2")
    # a node n1 enrolled and up (its checks: test_a_study_dry_run_refuses_a_device_or_node_that_is_not_there)
    from cloudbox.core.run import preflight

    monkeypatch.setattr(preflight, "node_problems", lambda spec, **kw: [])
    code, out, _ = cli_run(["study", "run", "b", "--size", "quick", "--dry-run", "--node", "n1"])
    assert code == 0 and "propagation sweep (kvm-cache-writethrough): skipped, the sweep runs on this host only" in out


def test_study_a_dry_run_names_the_whole_disk_cells_a_loop_device_stands_in_for(cli_run):
    code, out, _ = cli_run(["study", "run", "a", "--size", "quick", "--dry-run"])
    assert code == 0
    loop = {ln.split(":")[0].strip(): ln for ln in out.splitlines() if "a whole-disk profile with no --device" in ln}
    assert set(loop) == {"virtio-disk", "kvm-scsi-phy"}, out
    assert ("rule(s) A2.disk, A2.native, A2.rq, A2.qu, A2.util, E4.virtio, A2.rd, A3, A3.qu, A3.util will be "
            "inconclusive") in loop["virtio-disk"]
    assert "give --device /dev/DISK (and --destroy DISK when it holds data)" in loop["kvm-scsi-phy"]
    # a device that is not one is refused before any plan: nothing would run on it
    code, out, err = cli_run(["study", "run", "a", "--size", "quick", "--dry-run", "--device", "/dev/null"])
    assert code == 2 and out == "" and "/dev/null: not a block device" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["--device", "/dev/sdz9"], "/dev/sdz9: no such device"),
    (["--node", "be1"], "--node 'be1': no such node; allowed: none enrolled"),
])
def test_a_study_dry_run_refuses_a_device_or_node_that_is_not_there(argv, message, cli_run):
    code, out, err = cli_run(["study", "run", "a", "--size", "quick", "--dry-run", *argv])
    assert code == 2 and out == "" and message in err, (out, err)


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a loop device stands in for a spare disk)")
def test_a_study_dry_run_with_a_spare_disk_names_no_loop_device(tmp_path, cli_run):
    disk = tmp_path / "spare.img"
    disk.write_bytes(b"\0" * (64 << 20))
    loop = subprocess.run(["losetup", "--find", "--show", str(disk)], capture_output=True, text=True,
                          check=True).stdout.strip()
    try:
        code, out, err = cli_run(["study", "run", "a", "--size", "quick", "--dry-run", "--device", loop])
    finally:
        subprocess.run(["losetup", "-d", loop], check=False)
    assert code == 0, err
    assert "a whole-disk profile with no --device" not in out


# ---------------------------------------------------------------------------------------------- free space
def _free(monkeypatch, tmp_path: Path, free: int) -> None:
    """Every file system cloudbox asks about is `tmp_path`'s, with `free` bytes free."""
    monkeypatch.setattr(backing, "free_bytes_at", lambda d: (tmp_path, free))


def test_a_sweep_that_does_not_fit_is_refused_before_anything_starts(tmp_path, monkeypatch, cli_run):
    """Quick size: the cells' largest run needs 2 x 128 MiB + 64 MiB = 320 MiB, which fits in 350 MiB; the sweep needs
    its three source images (224 MiB) and its largest copy (128 MiB) with the margin: 416 MiB, which does not."""
    _free(monkeypatch, tmp_path, 350 * MIB)
    for argv in (["--dry-run"], ["--detach"], []):
        code, out, err = cli_run(["study", "run", "b", "--size", "quick", *argv])
        assert code == 1 and out == ""
        assert err == (f"cloudbox: {tmp_path}: not enough free space for the image-propagation sweep (images of 32 "
                       "MiB, 64 MiB, 128 MiB): it needs 416.0 MiB for the largest instance copy and the source images "
                       "still to make (224.0 MiB) (64.0 MiB margin included), 350.0 MiB free. Allowed: a --work-dir on "
                       "a larger file system, or more free space there\n")
    with ResultStore() as store:
        assert store.list_runs() == []  # nothing recorded, nothing started
    assert not propagation.store_dir().exists()


def test_source_images_already_made_or_to_be_removed_count_in_the_free_space(tmp_path, monkeypatch):
    store = propagation.store_dir()
    store.mkdir(parents=True)
    with open(store / "128m.raw", "wb") as f:  # complete (its full size): not made again
        f.truncate(128 * MIB)
    need = 128 * MIB + 96 * MIB + backing.MARGIN  # the largest copy, the 32 and 64 MiB sources, the margin
    _free(monkeypatch, tmp_path, need)
    propagation.check_space([32 * MIB, 64 * MIB, 128 * MIB], tmp_path / "work")
    _free(monkeypatch, tmp_path, need - 1)
    with pytest.raises(NoSpace, match=r"it needs 288\.0 MiB .* 288\.0 MiB free"):
        propagation.check_space([32 * MIB, 64 * MIB, 128 * MIB], tmp_path / "work")
    # a study-size sweep would remove the 128 MiB source: it counts as free (and the message says so)
    with pytest.raises(NoSpace, match=r"\(counting 128\.0 MiB of source images the sweep would remove\)\. "
                                      r"Allowed: --size quick"):
        propagation.check_space([512 * MIB, 1024 * MIB], tmp_path / "work", hint="--size quick")


# ----------------------------------------------------------------------------------- source images and the copy
def test_a_source_image_is_data_throughout_and_its_copy_is_the_same_bytes(tmp_path):
    src = tmp_path / "src.raw"
    seen: list[tuple[int, int]] = []
    propagation.fill_file(src, 9 * MIB, lambda done, total: seen.append((done, total)))
    assert src.stat().st_size == 9 * MIB and seen[-1] == (9 * MIB, 9 * MIB)
    assert src.stat().st_blocks * 512 >= 9 * MIB  # no hole
    data = src.read_bytes()
    pages = {data[i:i + 4096] for i in range(0, len(data), 4096)}
    assert len(pages) == 9 * MIB // 4096  # no two pages alike: nothing for deduplication to fold
    assert data.count(b"\0" * 4096) == 0
    dst = tmp_path / "instance.raw"
    seconds = propagation.copy_image(src, dst)
    assert seconds > 0 and dst.read_bytes() == data and dst.stat().st_blocks * 512 >= 9 * MIB
    with pytest.raises(FileExistsError):  # always a fresh instance file
        propagation.copy_image(src, dst)


def test_the_store_keeps_whole_images_of_the_wanted_sizes_only():
    store = propagation.store_dir()
    store.mkdir(parents=True)
    for name, size in (("32m.raw", 32 * MIB), ("64m.raw", MIB), ("128m.raw.part", MIB), ("notes.txt", 1)):
        with open(store / name, "wb") as f:
            f.truncate(size)
    found = [(x.path.name, x.complete) for x in propagation.list_sources()]
    assert found == [("32m.raw", True), ("64m.raw", False), ("128m.raw.part", False)]
    removed = propagation.clear_sources(keep=[32 * MIB, 64 * MIB])
    assert sorted(x.path.name for x in removed) == ["128m.raw.part", "64m.raw"]  # cut or short: made again
    assert sorted(p.name for p in store.iterdir()) == ["32m.raw", "notes.txt"]


def test_study_images_lists_and_clears_the_store(cli_run):
    code, out, _ = cli_run(["study", "images"])
    assert code == 0 and out.startswith("no source images in ")
    store = propagation.store_dir()
    store.mkdir(parents=True)
    with open(store / "32m.raw", "wb") as f:
        f.truncate(32 * MIB)
    code, out, _ = cli_run(["study", "images"])
    assert code == 0 and out == f"{store}:\n     32 MiB  32m.raw\n"
    code, out, _ = cli_run(["study", "images", "--clear"])
    assert code == 0 and out == f"removed 1 source image(s) from {store} (32.0 MiB)\n"
    assert list(store.iterdir()) == []


# ---------------------------------------------------------------------------------------------- the run's spec
def test_a_propagation_spec_is_refused_where_it_cannot_run():
    ok = RunSpec(profile=PROFILE, suite="propagation", size="quick", propagate=[32 * MIB, 32 * MIB, 64 * MIB])
    ok.validate()
    assert ok.propagation and not ok.wants_storage and not ok.wants_network
    assert [s.test for s in ok.plan()] == ["propagate-32m#1", "propagate-32m#2", "propagate-64m#1"]
    assert RunSpec.from_dict(ok.as_dict()) == ok  # a sweep file or a detached executor's argument
    for bad, match in (
        (dict(node="n1"), r"--node 'n1': the image-propagation sweep runs on this host only"),
        (dict(device="/dev/sdx"), r"--device '/dev/sdx' does not apply to the image-propagation sweep"),
        (dict(propagate=[]), r"a propagation run needs image sizes"),
        (dict(propagate=[32 * MIB + 1]), r"image size 33554433 is not allowed; allowed: a whole number of MiB"),
        (dict(propagate=[MIB]), r"image size 1048576 is not allowed"),
    ):
        spec = RunSpec(**{**ok.as_dict(), **bad})
        with pytest.raises(UsageError, match=match):
            spec.validate()
    with pytest.raises(UsageError, match="image sizes to propagate belong to a propagation run"):
        RunSpec(profile=PROFILE, suite="storage", propagate=[32 * MIB]).validate()


def test_cloudbox_run_does_not_offer_the_sweep(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--profile", PROFILE, "--suite", "propagation"])
    assert exc.value.code == 2
    assert "invalid choice: 'propagation'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ the database
def test_a_schema_2_database_upgrades_in_place_to_take_propagation_runs(tmp_path: Path):
    db = tmp_path / "v2.db"
    with sqlite3.connect(db) as c:  # a database as a cloudbox with guest sessions (schema 2) left it
        schema._migrate_0_to_1(c)
        schema._migrate_1_to_2(c)
        c.execute("PRAGMA user_version = 2")
        c.execute("INSERT INTO runs (id, uuid, suite, state) VALUES (5, 'u5', 'guest', 'completed')")
        c.execute("INSERT INTO measurements (run_id, side, test, metric, value) VALUES (5, 'guest', 't', 'MB/s', 3)")
        with pytest.raises(sqlite3.IntegrityError):
            c.execute("INSERT INTO runs (uuid, suite) VALUES ('p', 'propagation')")  # schema 2 refuses the sweep
    with ResultStore(db) as s:
        assert s.schema_version == schema.SCHEMA_VERSION == 6
        assert s.get_run(5).suite == "guest" and s.get_run(5).value("guest", "t", "MB/s") == 3
        rid = s.create_run(suite="propagation")
        s.add_measurement(rid, side="guest", test="propagate-32m", metric="total_s", value=9.0)
        assert s.get_run(rid).suite == "propagation"
    with sqlite3.connect(db) as c:
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert c.execute("PRAGMA foreign_key_check").fetchall() == []
        with pytest.raises(sqlite3.IntegrityError):  # the CHECK still refuses what is not a suite
            c.execute("INSERT INTO runs (uuid, suite) VALUES ('b', 'bogus')")



# -------------------------------------------------------------------- the executor's body, with a fake guest
class FakeGuest:
    """What the body asks of a launched guest; destroyed ones are counted."""

    destroyed: list[str] = []

    def __init__(self, name: str) -> None:
        self.name = name
        self.console_log = None  # no console: a failed run's reason has no console tail

    def destroy(self) -> None:
        if self.name not in FakeGuest.destroyed:
            FakeGuest.destroyed.append(self.name)

    def xml(self) -> str:
        return "<domain/>"

    def sh(self, script: str, **kw: object) -> object:
        return SimpleNamespace(stdout="6.1.0\n")


@pytest.fixture
def fake_host(state, monkeypatch):
    """The propagation body on this host with everything that needs libvirt or root faked: the image, the
    accelerator (TCG), libvirt, the facts, the cache drop and the launch (which registers the guest's destroy as the
    real one does, and fails where `fail_at` says)."""
    from cloudbox.core.bench import runners
    from cloudbox.core.errors import GuestUnreachable
    from cloudbox.core.run import launch as launch_mod
    from cloudbox.core.run import propagate
    from cloudbox.core.virt.accel import Accelerator

    FakeGuest.destroyed = []
    launched: list[str] = []
    fail_at: dict[str, int] = {}

    def image(ctx):
        ctx.image = GuestImage(Path("/boot"), Path("/boot/vmlinuz"), Path("/boot/initrd.img"), {})

    def accelerator(ctx):
        ctx.accelerator = Accelerator("tcg", "qemu", True, False, "faked")
        ctx.labels.append("emulated")

    def launch(ctx):
        assert "<source file=" in ctx.domain_xml and Path(ctx.work_dir).is_dir()
        guest = FakeGuest(f"g{len(launched) + 1}")
        with ctx.control.atomic():
            ctx.stack.callback(guest.destroy)
            ctx.guest = guest
        launched.append(guest.name)
        if fail_at.get("launch") == len(launched):
            raise GuestUnreachable("the guest agent did not answer within 300 s")
        return launch_mod.Launched(guest, 0.2, 0.2, 1)  # type: ignore[arg-type]

    monkeypatch.setattr(propagate, "find_image", image)
    monkeypatch.setattr(propagate, "probe_accelerator", accelerator)
    monkeypatch.setattr(propagate, "connect_libvirt", lambda ctx: None)
    monkeypatch.setattr(propagate, "record_facts", lambda ctx: None)
    monkeypatch.setattr(propagate, "launch", launch)
    monkeypatch.setattr(runners, "drop_host_caches", lambda: True)
    return SimpleNamespace(launched=launched, fail_at=fail_at, state=state)


def _execute(sizes_mib: list[int]) -> tuple[int, list]:
    from cloudbox.core.run.lifecycle import Execution
    from cloudbox.core.run.propagate import run_propagation

    spec = RunSpec(profile=PROFILE, suite="propagation", size="quick", propagate=[m * MIB for m in sizes_mib])
    seen: list = []
    with ResultStore() as store:
        rid = Execution(spec, store, run_propagation, emit=seen.append).execute()
    return rid, seen


def _work_left(state: Path) -> list[str]:
    work = state / "state" / "work"
    return sorted(str(p) for p in work.rglob("*")) if work.exists() else []


def test_the_body_stores_each_sample_and_leaves_only_the_source_images(fake_host):
    rid, seen = _execute([4, 8, 4])
    with ResultStore() as store:
        run = store.get_run(rid)
    assert run.state == "completed", run.reason
    got = propagation.samples_of(run)
    assert [x.size_bytes // MIB for x in got] == [4, 8, 4]
    assert all(x.copy_s > 0 and x.total_s >= x.copy_s + x.boot_s - 1e-6 for x in got)
    assert all(x.qualifiers == ["emulated", "quick"] for x in got)
    assert run.size_bytes == 8 * MIB and run.suite == "propagation"
    # each size's samples are its figure's repeats, each in a guest boot of its own
    four = run.figure("guest", "propagate-4m", "total_s")
    assert four is not None and [(m.repeat, m.boot, m.iteration) for m in four.samples] == [(1, 1, 1), (2, 2, 1)]
    assert four.boots == 2 and run.figure("guest", "propagate-8m", "copy_s").n == 1  # type: ignore[union-attr]
    assert FakeGuest.destroyed == ["g1", "g2", "g3"]  # each guest destroyed after its sample
    assert _work_left(fake_host.state) == []
    assert [(x.size_bytes // MIB, x.complete) for x in propagation.list_sources()] == [(4, True), (8, True)]
    texts = [getattr(ev, "text", "") for ev in seen]
    assert "propagation: 4 MiB image, sample 2 of 2" in texts
    assert any(t.startswith("4 MiB: copy ") and "boot to agent" in t for t in texts)


def test_a_guest_that_does_not_come_up_leaves_no_guest_copy_or_temp_file(fake_host):
    fake_host.fail_at["launch"] = 2
    rid, _ = _execute([4, 8])
    with ResultStore() as store:
        run = store.get_run(rid)
    assert run.state == "aborted" and "the guest agent did not answer" in (run.reason or "")
    assert [x.size_bytes // MIB for x in propagation.samples_of(run)] == [4]  # the first sample stays and counts
    assert FakeGuest.destroyed == ["g1", "g2"]
    assert _work_left(fake_host.state) == []
    assert not any(p.name.endswith(".part") for p in propagation.store_dir().iterdir())


def test_ctrl_c_while_a_source_image_is_made_removes_the_cut_image(fake_host, monkeypatch):
    import signal

    def cut(path, size, progress=None):
        with open(path, "xb") as f:
            f.write(b"x" * 4096)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(propagation, "fill_file", cut)
    rid, _ = _execute([4])
    with ResultStore() as store:
        run = store.get_run(rid)
    assert (run.state, run.reason) == ("aborted", "cancelled by SIGINT")
    assert list(propagation.store_dir().iterdir()) == [] and _work_left(fake_host.state) == []
    assert fake_host.launched == []


@pytest.mark.parametrize(("accelerator", "emulated", "labels", "want"), [
    ("tcg", True, ("emulated", "nested", "quick-size"), ["emulated", "quick"]),  # TCG on a virtual host
    ("nested-kvm", True, ("nested",), ["nested"]),
    ("kvm", False, ("warm-cache",), ["warm cache"]),
])
def test_a_sample_names_what_weakens_it_emulation_before_nesting(accelerator, emulated, labels, want):
    from cloudbox.core.bench.propagation import Sample

    s = Sample(1, 32 * MIB, 0.1, 10.0, 10.1, T0, accelerator, emulated, "quick" if "quick" in want else "study",
               labels, False)
    assert s.qualifiers == want
