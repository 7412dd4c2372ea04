"""cloudbox: evaluate what virtualization costs a host's storage and network I/O."""

__version__ = "0.1.0"
