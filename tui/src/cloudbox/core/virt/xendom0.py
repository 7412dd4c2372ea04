"""dom0's vCPU pinning and memory for one run (a Xen profile's [dom0] table), set with `xl` on the Xen boot and put
back as they were after the run.

- `vcpu_pin`: `xl vcpu-pin Domain-0 all <cpus>` (hard affinity of every dom0 vCPU); each vCPU's hard and soft
  affinity as `xl vcpu-list` showed them before is restored one by one.
- `memory_mib`: `xl mem-set Domain-0 <N>m`, then dom0's size (`xl list`) is watched until the balloon driver
  reaches it. Past dom0's maximum (`dom0_mem=...,max:` on Xen's command line) or with ballooning off it never does:
  the old size is asked back and the run refused, naming the boot parameter that gives dom0 that memory instead.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import CloudboxError
from ..spec.knobs import Dom0, cpu_list
from .accel import parse_xl_info

DOM0 = "Domain-0"
XL_TIMEOUT_S = 60
BALLOON_WAIT_S = 60.0  # for dom0's balloon driver to reach a new size (seconds under TCG)
BALLOON_SLACK_MIB = 8  # `xl list` rounds; the balloon driver stops a few pages short


@dataclass
class VcpuAffinity:
    vcpu: int
    hard: str  # as `xl vcpu-list` prints it: "all", "0-1", ...
    soft: str


def parse_vcpu_list(text: str) -> list[VcpuAffinity]:
    """dom0's vCPUs from `xl vcpu-list Domain-0`: Name ID VCPU CPU State Time(s) Affinity (Hard / Soft)."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 8 or parts[0] != DOM0 or not parts[2].isdigit():
            continue
        hard, _, soft = " ".join(parts[6:]).partition("/")
        out.append(VcpuAffinity(int(parts[2]), hard.strip(), soft.strip() or "all"))
    return out


def parse_list_memory(text: str) -> int | None:
    """dom0's memory in MiB from `xl list Domain-0`: Name ID Mem VCPUs State Time(s)."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == DOM0 and parts[2].isdigit():
            return int(parts[2])
    return None


@dataclass
class Tuning:
    """One run's change to dom0: `apply()` sets the profile's knobs, `restore()` puts back what it changed."""

    knobs: Dom0
    xl: str = "xl"
    cancelled: Callable[[], bool] = lambda: False
    affinity_before: list[VcpuAffinity] = field(default_factory=list)
    memory_before_mib: int | None = None
    memory_mib: int | None = None  # dom0's size once set
    _pinned: bool = False
    _ballooned: bool = False

    def run_xl(self, *args: str) -> str:
        try:
            r = subprocess.run([self.xl, *args], capture_output=True, text=True, timeout=XL_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise CloudboxError(f"xl {' '.join(args)}: {e}") from e
        if r.returncode != 0:
            raise CloudboxError(f"xl {' '.join(args)} failed (exit {r.returncode}): "
                                f"{(r.stderr or r.stdout).strip()[-300:]}")
        return r.stdout

    def apply(self) -> None:
        """Pin, then size dom0; CloudboxError (naming the profile key) when this host cannot have it. What was set
        before a refusal stays for restore()."""
        k = self.knobs
        if k.vcpu_pin:
            nr = parse_xl_info(self.run_xl("info")).get("xen_cpus", "")
            cpus = cpu_list(k.vcpu_pin)
            if nr.isdigit() and cpus[-1] >= int(nr):
                raise CloudboxError(f"dom0.vcpu_pin = {k.vcpu_pin!r}: this host has physical CPUs 0..{int(nr) - 1} "
                                    f"(xl info: nr_cpus {nr}); allowed: CPUs among 0-{int(nr) - 1}")
            self.affinity_before = parse_vcpu_list(self.run_xl("vcpu-list", DOM0))
            self._pinned = True
            self.run_xl("vcpu-pin", DOM0, "all", k.vcpu_pin)
        if k.memory_mib:
            self.memory_before_mib = parse_list_memory(self.run_xl("list", DOM0))
            self._ballooned = True
            self.run_xl("mem-set", DOM0, f"{k.memory_mib}m")
            got = self._wait_memory(k.memory_mib)
            if got is None or abs(got - k.memory_mib) > BALLOON_SLACK_MIB:
                raise CloudboxError(
                    f"dom0.memory_mib = {k.memory_mib}: dom0 stayed at {got} MiB after `xl mem-set` "
                    f"({BALLOON_WAIT_S:.0f} s): its memory cannot change to that at run time here (above its maximum "
                    f"from Xen's dom0_mem=...,max: or ballooning off). Boot Xen with dom0_mem={k.memory_mib}M,"
                    f"max:{k.memory_mib}M (the Xen entry's options line in /xen/xen.cfg, grub's multiboot2 line) and "
                    "leave dom0.memory_mib = 0, or choose a size dom0 can balloon to")
            self.memory_mib = got

    def _wait_memory(self, want: int) -> int | None:
        deadline = time.monotonic() + BALLOON_WAIT_S
        got = None
        while not self.cancelled():
            got = parse_list_memory(self.run_xl("list", DOM0))
            if got is not None and abs(got - want) <= BALLOON_SLACK_MIB or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        return got

    def restore(self) -> str:
        """Put back what apply() changed; one line saying what was restored ("" for nothing), or what failed."""
        done, failed = [], []
        if self._ballooned and self.memory_before_mib:
            try:
                self.run_xl("mem-set", DOM0, f"{self.memory_before_mib}m")
                done.append(f"memory {self.memory_before_mib} MiB")
            except CloudboxError as e:
                failed.append(str(e))
            self._ballooned = False
        if self._pinned:
            for a in self.affinity_before:
                try:
                    self.run_xl("vcpu-pin", DOM0, str(a.vcpu), a.hard, a.soft)
                except CloudboxError as e:
                    failed.append(str(e))
            done.append("vCPU affinity " + ", ".join(f"{a.vcpu}: {a.hard} / {a.soft}" for a in self.affinity_before))
            self._pinned = False
        if failed:
            return "dom0 not fully restored: " + "; ".join(failed)
        return f"dom0 restored: {'; '.join(done)}" if done else ""
