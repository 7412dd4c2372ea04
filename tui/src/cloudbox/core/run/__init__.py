"""Executing a run; it imports cluster and everything below it.

    runs           starting runs: the executor, detached executors, cancelling, sweeps
    preflight      what a run needs that is checked before it is recorded: nodes, device, hypervisor, volumes, space
    lifecycle      one run from lock to final state: its row, signals, the cleanup stack, its ledger
    reclaim        cleaning up after runs whose executor is gone: marked aborted, their ledgers undone
    context        one run's state as its steps share it
    sink           where a run's events go
    local          a run on this host as small steps over one context
    repeated       a repeated run on this host: bare metal and guest in turn, across boots, until sure
    multi          N guests at once on this host (--guests N), and mixed profiles
    measure        one test measured and stored, with the host disk's counters over its window
    launch         launching the guest and waiting for its agent
    network_steps  the network side of a run on this host
    placing        a profile's [placement]: guests placed on the host's CPUs and nodes, huge pages, read back
    propagate      an image-propagation run (study B's sweep)
    hold           one place's side of a spread run's start barrier
    mirror         the front-end's run on an enrolled node, mirrored here
    spread         a run of N guests spread over several places, coordinated here
"""
