"""What this box can answer: for each study, at each of its sizes, whether every cell can run here, and for the cells
that cannot, what is missing (a spare disk for the whole-disk rows, a back-end for the tests towards another node,
the Xen boot, CPUs or memory for its guests, a kernel module), from the readiness facts of the box and the same
checks a study run makes; `answers()` is the whole report `cloudbox host readiness` and the TUI's Overview show.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..cluster import registry
from ..errors import CloudboxError
from ..run.multi import QEMU_OVERHEAD_MIB
from ..spec import profiles
from ..views import readiness
from ..views.readiness import Readiness
from ..virt.accel import Accelerator
from .evidence import profile_facts
from .loading import list_studies, load_study
from .schema import Study, needs_node

HOST_RESERVE_MIB = 512  # what the host keeps for itself beside its guests (run.multi's check does the same)


@dataclass
class Capability:
    """One study at one size on this box."""

    study: str
    title: str
    size: str
    cells: int  # profile x test cells of its matrix
    runnable: int  # of them, the cells this box can run
    missing: list[str] = field(default_factory=list)  # what the others need (or the weaker cells), one line each
    loop_device: list[str] = field(default_factory=list)  # whole-disk profiles a loop device would stand in for

    @property
    def whole(self) -> bool:
        return self.runnable == self.cells


def _cells(study: Study) -> int:
    return len(study.profile_names) * len(study.test_ids)


def capability(study: Study, ready: Readiness, *, size: str, nodes: list[str]) -> Capability:
    """`study` at `size` on the box `ready` describes; `nodes`: the back-ends enrolled here (for the tests towards
    another node)."""
    _, unavailable = profile_facts(study)
    missing: dict[str, list[str]] = {}
    blocked: set[tuple[str, str]] = set()
    spare = [d for d in ready.disks if not d.in_use]
    loop: list[str] = []
    towards: list[str] = []
    guests = study.guests(size)
    for name in study.profile_names:
        prof = profiles.find_profile(name)
        why = unavailable.get(name)
        if why is None:
            vcpus, mem = prof.guest.vcpus * guests, (prof.guest.memory_mib + QEMU_OVERHEAD_MIB) * guests
            if vcpus > ready.cpus:
                why = (f"{vcpus} CPUs for {guests} guest{'s' if guests > 1 else ''} of {prof.guest.vcpus} vCPU"
                       f"{'s' if prof.guest.vcpus > 1 else ''} (this box has {ready.cpus})")
            elif mem + HOST_RESERVE_MIB > ready.memory_bytes // 1024**2:
                why = (f"{(mem + HOST_RESERVE_MIB) / 1024:.1f} GiB of memory for its guests and the host (this box "
                       f"has {ready.memory_bytes / 1024**3:.1f} GiB)")
        if why is not None:
            missing.setdefault(f"not here ({why})", []).append(name)
            blocked |= {(name, t) for t in study.test_ids}
            continue
        if prof.disk.backing == "block-device" and not spare:
            loop.append(name)
        for t in study.test_ids:
            if needs_node(t) and not nodes:
                towards.append(t)
                blocked.add((name, t))
    lines = [f"{why}: {', '.join(dict.fromkeys(who))}" for why, who in missing.items()]
    if towards:
        # the private network wants a NIC of its own beside the campus one
        nic = "" if len(ready.nics) >= 2 else (f", and a second NIC on this box for the private network (it has "
                                               f"{len(ready.nics) or 'no'} NIC{'' if len(ready.nics) == 1 else 's'})")
        lines.insert(0, "needs a back-end enrolled on the private network (a second machine) for the tests towards "
                        f"another node: {', '.join(dict.fromkeys(towards))} ({len(towards)} cells){nic}")
    return Capability(study.name, study.title, size, _cells(study), _cells(study) - len(blocked), lines, loop)


def capabilities(ready: Readiness, *, nodes: list[str]) -> list[Capability]:
    """Every shipped study at each of its sizes (invalid study files are left out: `study list` names them)."""
    out = []
    for entry in list_studies():
        if entry.problem:
            continue
        study = load_study(entry.path)
        out += [capability(study, ready, size=size, nodes=nodes) for size in study.sizes]
    return out


@dataclass
class Answers:
    """The readiness report: the box's facts, then what it can answer, study by study and size by size."""

    facts: Readiness
    studies: list[Capability]


def enrolled_nodes() -> list[str]:
    """The back-ends enrolled here (none when the registry cannot be read: the tests towards one are then missing)."""
    if not registry.nodes_db().exists():
        return []
    try:
        with registry.Registry() as reg:
            return [n.name for n in reg.nodes()]
    except CloudboxError:
        return []


def answers(acc: Accelerator | None, *, fio_seconds: int = readiness.FIO_SECONDS, devices: list[str] | None = None,
            link_seconds: int | None = readiness.LINK_SECONDS) -> Answers:
    """The box's readiness (readiness.gather's options; `acc`: the accelerator guests get, None when not probed)
    and what it can answer with the nodes enrolled here."""
    facts = readiness.gather(fio_seconds=fio_seconds, devices=devices, link_seconds=link_seconds,
                             accelerator=f"{acc.label}: {acc.reason}" if acc else "",
                             emulated=acc.emulated if acc else None, nested=acc.nested if acc else False)
    return Answers(facts, capabilities(facts, nodes=enrolled_nodes()))


def lines(caps: list[Capability]) -> list[str]:
    """What this box can answer, in words: one line per study and size, then what is missing."""
    out = []
    for c in caps:
        head = f"study {c.study} at {c.size} size: "
        out.append(head + ("every cell can run here" if c.whole else f"{c.runnable} of {c.cells} cells can run here"))
        out += [f"  {m}" for m in needs(c)]
    return out


def needs(c: Capability) -> list[str]:
    """What the cells that cannot run need, and the rows a loop device would stand in for, one line each."""
    out = list(c.missing)
    if c.loop_device:
        out.append("needs a spare disk (unmounted, its data not needed) for the whole-disk rows, else a loop "
                   f"device stands in and their verdicts are inconclusive: {', '.join(c.loop_device)}")
    return out
