"""What a run is asked to do, as validated data; it imports only the shared helpers.

    schema      what every validated input shares: strict models, safe strings, problems, TOML files kept parsed
    knobs       the tuning knobs: their values, tables (guest, disk, network, dom0, nfs) and the rules between them
    iopaths     today's I/O paths' knobs: the [placement] table, vhost-user and NVMe disks, and their rules
    profiles    tuning profiles (TOML): the whole file's schema, lookup, comparison and canonical forms
    runspec     the RunSpec, the run options declared once, sizes and the run's plan
    catalogue   every storage and network test, their sets, and a stored test name's kind, title, order and metric
    nodeconf    this node as installed: node names, its settings file, its private link
    addresses   the run network's names and addresses on one host
    schemes     the network-volume schemes, one record of facts each
    remote      the URI of a volume a front-end serves to a back-end's run
"""
