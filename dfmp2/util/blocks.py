"""Index ranges in blocks: the one way every layer cuts an index into pieces."""

from __future__ import annotations


def block_ranges(n, size):
    """[(start, stop)] covering range(n) in pieces of `size`."""
    return [(start, min(start + size, n)) for start in range(0, n, size)]
