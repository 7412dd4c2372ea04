"""A node's name rule, one for the registry, enrolment and the run lock."""

from __future__ import annotations

import re

NODE_NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
NODE_NAME_ALLOWED = "lowercase letters, digits and '-', 1..63 characters, not starting or ending with '-'"


def is_node_name(value: object) -> bool:
    """Whether `value` is a node name as a whole (fullmatch: '$' alone would let a trailing newline through)."""
    return isinstance(value, str) and re.fullmatch(NODE_NAME_PATTERN, value) is not None
