"""cloudbox.core: everything cloudbox does, with no front end in it (it never imports Textual). Its packages, each
about one concern, from the top of the import order to the bottom (a package imports only those below it; the
contract is in tui/pyproject.toml and `make lint` checks it):

    studies/   the published studies as data, their verdicts over stored runs, their reports
    install/   installing the appliance from the live stick onto a node's disk
    views/     tables and summaries over stored runs and this box (compare, the host overview)
    run/       executing a run: its lifecycle and steps on this host, on an enrolled node, spread over places
    cluster/   the front-end and its back-ends: node registry, enrolment, the SSH client, health
    bench/     the benchmarks themselves: storage and network test tools, MPI-IO, image propagation
    record/    what a run leaves: results, events, provenance, the run lock, statistics over figures
    virt/      what runs a guest: accelerator, libvirt daemons, domain XML, the guest and its agent, host networking
    disks/     what a guest's disk sits on: backing stores, host RAID, disk metrics, mounts, network volumes
    spec/      what is asked: profiles, the run spec, the test catalogue, node settings, run addresses

Shared helpers at the bottom, importable from everywhere: errors (the exception types), inputs (the one door for
untrusted input and the one way it is shown), paths (where state lives), procs (child processes), db (SQLite),
ledger (what a run holds on the host, written down before it is made, and undoing it after a dead run).
"""
