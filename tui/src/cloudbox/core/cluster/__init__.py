"""The cluster: a front-end and the back-ends it enrolled; it imports bench and everything below it. docs/cluster.md
has the design, the protocol and the threat model.

    protocol     what crosses the wire, declared once: enrolment messages, the start-run request, their limits
    registry     the front-end's node registry and join codes (nodes.db)
    enrol        a back-end joins with a one-time code; both sides pin each other's keys
    keys         SSH keys, fingerprints and the files enrolment writes
    client       the front-end's work on a node over the pinned SSH (image propagation, remote runs)
    frontend     what a front-end does with its cluster (join codes, the enrolment server)
    discover     a back-end finding its front-end (the DHCP server of its private NIC)
    health       whether each node's libvirt answers
    volumecreds  the front-end's side of a back-end's volume credentials
"""
