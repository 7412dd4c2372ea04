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


def test_a_job_across_guests_is_refused_where_the_guests_sit_on_the_private_network(state):
    """fio --server (any job it is sent, as root) and Open MPI's listener in a guest on a private lease would be
    open to every host on the private network: the front-end refuses such a run before it is recorded, and a node
    refuses the request if one comes."""
    from cloudbox.core.errors import UsageError
    from cloudbox.core.run import preflight
    from cloudbox.core.run.multi import run_profiles
    from cloudbox.core.spec.runspec import RunSpec

    def problem(**kw):
        spec = RunSpec(**{"profile": "virtio-disk", "suite": "storage", "guests": 2, "node": "be1",
                          "storage_tests": "fiocs-seq-write-64k", **kw})
        return preflight.private_network_problem(spec, run_profiles(spec))

    refused = problem(suite="all")  # network tests to the front-end: the guests take private leases
    assert refused is not None and refused.usage and "fio --server runs any job it is sent" in str(refused)
    assert problem(profile="nfs-async-tcp") is not None  # the front-end's NFS export: private leases too
    assert problem(storage_tests="mpiio-fpp-1m", suite="all") is not None
    assert problem() is None  # the node's own disks, its run bridge: nothing on the private network
    assert problem(node="") is None and problem(storage_tests="smoke", suite="all") is None
    for sent in ({"peer": "10.73.0.1"}, {"nfs_host": "10.73.0.1", "nfs_port": 2049},
                 {"volume_uri": "nbds://10.73.0.1:10809/ebs", "peer": "10.73.0.1"}):
        with pytest.raises(UsageError, match="whose servers in the guests take no authentication"):
            RunSpec(profile="virtio-disk", suite="storage", guests=2, storage_tests="fiocs-seq-write-64k",
                    **sent).validate()
