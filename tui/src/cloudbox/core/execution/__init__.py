"""Executing a run: its lifecycle (lock, signals, cleanup, final state), the run context its steps share, the
event sink, and the steps of a run on this host (local). A run on an enrolled node is mirrored by core.nodes.mirror
over the same lifecycle."""
