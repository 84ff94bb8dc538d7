"""Files written whole or not at all, and the versions of installed packages.

`write_atomically` is the one temporary-file-then-rename writer: the checkpoint's manifest,
arrays and B blocks, and the plugin's ovL files go through it. (`dfmp2.outputs` stages a run's
several output files and commits them together, which is a transaction of its own.)
"""

from __future__ import annotations

import os
import tempfile


def write_atomically(path, write, partial=None) -> None:
    """Write the file at `path` whole or not at all: write(tmp) writes it at the temporary path
    tmp beside it (`partial`, a name the caller has recorded, e.g. in a checkpoint's manifest;
    default: a fresh hidden name), which is fsync'ed and renamed into place. On any failure the
    temporary file is deleted and the error raised; `path` is untouched."""
    path = os.fspath(path)
    if partial is None:
        handle, partial = tempfile.mkstemp(prefix=".dfmp2-", suffix=".partial",
                                           dir=os.path.dirname(os.path.abspath(path)))
        os.close(handle)
    try:
        write(partial)
        with open(partial, "rb") as written:
            os.fsync(written.fileno())
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def package_versions(names) -> dict:
    """{name: installed version, or None} of the distribution packages `names`."""
    from importlib import metadata

    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions
