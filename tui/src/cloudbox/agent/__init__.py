"""The node's agent: a front end of cloudbox on a back-end, run by the front-end over the pinned SSH as `cloudbox
node local OP` (core.cluster.client calls it), beside the CLI and the TUI and, like them, over cloudbox.core.

    agent     the operations: the guest image cache, runs (start, follow, cancel), and the node's facts
    requests  what the front-end sends on standard input, read through the wire's schemas (core.cluster.protocol)
"""
