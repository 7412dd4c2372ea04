"""What a run needs that can be checked without a guest is checked before the run is recorded (core.run.preflight):
an unknown node, a device that is not there, a Xen profile on the Linux boot, a volume that does not exist, too
little space. The command is refused with the reason and the exit code for bad input (2) or a host that cannot (1),
and no run is stored, in the foreground and detached alike."""

from __future__ import annotations

import pytest

from cloudbox import cli
from cloudbox.core.record.results import ResultStore


def _stored() -> list:
    with ResultStore() as store:
        return store.list_runs()


@pytest.mark.parametrize(("argv", "code", "message"), [
    (["--profile", "virtio-disk", "--node", "be9"], 2, "--node 'be9': no such node; allowed: none enrolled"),
    (["--profile", "virtio-disk", "--device", "/dev/nosuchdisk", "--destroy", "nosuchdisk"], 2,
     "/dev/nosuchdisk: no such device"),
    (["--profile", "virtio-disk", "--device", "/etc/hostname"], 2, "/etc/hostname: not a block device"),
    (["--profile", "xen-xvd-phy"], 1, "needs the Xen hypervisor"),
    (["--profile", "kvm-ebs-nbd"], 1, "no volume 'ebs' on this box; create it with: cloudbox volume create ebs"),
])
@pytest.mark.parametrize("detach", [False, True])
def test_a_refused_run_records_nothing(state, argv, code, message, detach, capsys):
    rc = cli.main(["run", "--suite", "storage", "--size", "16M", *argv, *(["--detach"] if detach else [])])
    err = capsys.readouterr().err
    assert rc == code and message in err, err
    assert _stored() == []
