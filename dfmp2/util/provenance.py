"""What a file dfmp2 reads back must prove: the identity of what it was made from.

Every file dfmp2 writes and may read again carries, inside it, the identity of the computation
it belongs to: a JSON-able dict (the molecule, basis sets, orbitals or their hash, frozen space,
precision and every other setting that changes its numbers; for a checkpoint's files, the
manifest sections they depend on). Reading a file back checks that identity against the one
the run expects before any of its numbers are used:

    HDF5 files (B, ovL)       attribute IDENTITY, canonical JSON (`stamp_h5`, `h5_identity`)
    .npz arrays (SCF, steps)  member IDENTITY, canonical JSON (`stamped`, `arrays_identity`)
    append-only journals      a header: JOURNAL_MAGIC and the sha256 of the identity (`journal_header`,
                              `journal_digest`), then the records

`mismatch(held, expected)` says why a file is not this run's (None: it is), naming the first
setting that differs with both of its values. What a mismatch leads to is the reader's policy:
a checkpoint recomputes the file with a note; a file asked for by name is refused (InputError).
A file dfmp2 did not write carries no identity: it is checked for what can be checked, and its
use is noted.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

IDENTITY = "dfmp2_identity"
JOURNAL_MAGIC = b"dfmp2-journal-v1"  # 16 bytes, then 32 bytes of sha256
JOURNAL_HEADER_BYTES = len(JOURNAL_MAGIC) + 32


def canonical(identity) -> str:
    """The identity as canonical JSON (sorted keys, no spaces; tuples as lists, numpy scalars
    and arrays as numbers and lists)."""
    return json.dumps(identity, sort_keys=True, separators=(",", ":"), default=_plain)


def _plain(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not part of a file identity")


def normalised(identity) -> dict:
    """The identity as JSON gives it back (what a file holds)."""
    return json.loads(canonical(identity))


def digest(identity) -> bytes:
    """sha256 of the canonical identity (32 bytes)."""
    return hashlib.sha256(canonical(identity).encode()).digest()


# ----------------------------------------------------------------------------- carrying it

def stamp_h5(handle, identity) -> None:
    """Write `identity` into the open HDF5 file `handle` (its attribute IDENTITY)."""
    handle.attrs[IDENTITY] = canonical(identity)


def h5_identity(handle) -> dict | None:
    """The identity an HDF5 file carries, or None (a file dfmp2 did not write, or an older one)."""
    text = handle.attrs.get(IDENTITY)
    if text is None:
        return None
    try:
        return json.loads(text.decode() if isinstance(text, bytes) else str(text))
    except ValueError:
        return None


def stamped(arrays: dict, identity) -> dict:
    """`arrays` (for np.savez) with the identity as the member IDENTITY."""
    return {**arrays, IDENTITY: np.array(canonical(identity))}


def arrays_identity(arrays: dict) -> tuple:
    """(identity or None, the arrays without it) of what np.load gave (a dict of arrays)."""
    arrays = dict(arrays)
    text = arrays.pop(IDENTITY, None)
    if text is None:
        return None, arrays
    try:
        return json.loads(str(text)), arrays
    except ValueError:
        return None, arrays


def journal_header(identity) -> bytes:
    """The first JOURNAL_HEADER_BYTES of a journal written for `identity`."""
    return JOURNAL_MAGIC + digest(identity)


def journal_digest(data: bytes) -> bytes | None:
    """The identity digest in a journal's header, or None where it has none (not dfmp2's, older)."""
    if len(data) < JOURNAL_HEADER_BYTES or not data.startswith(JOURNAL_MAGIC):
        return None
    return data[len(JOURNAL_MAGIC):JOURNAL_HEADER_BYTES]


# ----------------------------------------------------------------------------- checking it

def mismatch(held, expected) -> str | None:
    """None if the identity `held` (a file's; None: it carries none) is `expected`; else why
    not, in words: "it carries no dfmp2 identity" or "made for another run (KEY: A there, B now)"."""
    if held is None:
        return "it carries no dfmp2 identity (written by another program, or damaged)"
    where = difference(held, normalised(expected))
    return None if where is None else f"it was made for another run ({where})"


def difference(held, now, path="") -> str | None:
    """The first place where two JSON-like values differ, as 'KEY: A there, B now' with the
    key's full path (e.g. run.atoms[2][3]) and both values at that place; None if they are equal."""
    if isinstance(held, dict) and isinstance(now, dict):
        for key in sorted(set(held) | set(now), key=str):
            here = f"{path}.{key}" if path else str(key)
            if key not in held or key not in now:
                return f"{here}: {_shown(held.get(key, '(absent)'))} there, {_shown(now.get(key, '(absent)'))} now"
            found = difference(held[key], now[key], here)
            if found is not None:
                return found
        return None
    if isinstance(held, list) and isinstance(now, list):
        for k, (a, b) in enumerate(zip(held, now)):
            found = difference(a, b, f"{path}[{k}]")
            if found is not None:
                return found
        if len(held) != len(now):
            return f"{path}: {len(held)} entries there, {len(now)} now"
        return None
    if held != now:
        return f"{path or 'value'}: {_shown(held)} there, {_shown(now)} now"
    return None


def _shown(value, limit=80) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
