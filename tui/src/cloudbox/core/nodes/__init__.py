"""The cluster: the front-end's node registry and join codes (registry), enrolment with a one-time code and
key pinning (enrol), the SSH keys and files involved (keys), and node health (health). docs/cluster.md has the
design, the protocol and the threat model."""
