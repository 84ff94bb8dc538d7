"""Many molecules in one process: `dfmp2 run a.xyz b.xyz`, a multi-frame XYZ, or a directory.

Start-up (Python, torch, PySCF, the device's context and its loaded kernels) is paid once; each
molecule is its own run. A molecule that fails is recorded as failed with its one-line reason
and the others go on; the command's exit status says whether all succeeded (0) or not (1).
"""

from __future__ import annotations

import json
import os

from ..chem import read_frames
from ..util.errors import DFMP2Error, InputError
from ..util.files import display, one_line

XYZ_SUFFIX = ".xyz"


def molecule_sources(paths) -> list:
    """The XYZ files the command's arguments name, in order: files as given, a directory's *.xyz
    files sorted by name (hidden ones, such as macOS's ._x.xyz, left out). InputError for a path
    that does not exist or a directory without one."""
    sources = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(os.path.join(path, name) for name in os.listdir(path)
                           if name.lower().endswith(XYZ_SUFFIX) and not name.startswith(".")
                           and os.path.isfile(os.path.join(path, name)))
            if not found:
                raise InputError(f"{display(path)}: a directory without *.xyz files")
            sources += found
        elif not os.path.exists(path):
            raise InputError(f"{display(path)}: no such file")
        else:
            sources.append(path)
    return sources


def frames_of(sources):
    """(name, Frame or the InputError that reading it raised) of every frame of `sources`, in
    order: a frame that cannot be read is one failed entry and the file's next frame is read
    (`chem.read_frames(keep_going=True)`); a file that cannot be read at all is one entry."""
    for source in sources:
        try:
            frames = read_frames(source, keep_going=True)
        except InputError as error:
            yield display(source), error
            continue
        yield from named_frames(source, frames)


def named_frames(source, frames):
    """(name, Frame or InputError) of the frames `read_frames(source, keep_going=True)` gave: a
    frame's own name; an error, the frame's place in the file ("traj.xyz#3")."""
    for k, frame in enumerate(frames):
        if isinstance(frame, Exception):
            yield display(source if len(frames) == 1 else f"{source}#{k + 1}"), frame
        else:
            yield display(frame.name), frame


def failure_record(name: str, error: BaseException) -> dict:
    """The JSON Lines record of a molecule that failed: its one-line reason and the exit status a
    single run of it would have had (2 bad input, 1 failure)."""
    code = error.exit_code if isinstance(error, DFMP2Error) else 1
    reason = str(error) if isinstance(error, DFMP2Error) else f"{type(error).__name__}: {error}"
    return {"molecule": name, "status": "failed", "exit_code": code, "error": one_line(reason)}


def run_batch(entries, compute_frame, debug: bool, on_record=None) -> list:
    """Every frame of `entries` ((name, Frame or the InputError reading it raised), as `frames_of` gives them)
    through compute_frame(frame) -> record, one record per frame in order ({"molecule", "status": "ok", ...}
    or `failure_record`; a record that is not strict JSON, e.g. holding NaN, is its molecule's failure);
    on_record(record, its JSON line) after each. Signals stop the batch (they are not a molecule's failure);
    debug re-raises the first failure with its traceback."""
    records = []
    for name, frame in entries:
        record, line = _record_of(name, frame, compute_frame, debug)
        records.append(record)
        if on_record is not None:
            on_record(record, line)
    return records


def _record_of(name, frame, compute_frame, debug) -> tuple:
    """(record, its JSON line) of one entry of run_batch: its computed record, or its failure's
    (a reading error, a failed run, or a record that is not strict JSON)."""
    if not isinstance(frame, Exception):
        try:
            record = {"molecule": name, "status": "ok", **compute_frame(frame)}
            return record, json.dumps(record, allow_nan=False)
        except Exception as error:  # noqa: BLE001 - recorded, the batch goes on (the module docstring)
            if debug:
                raise
            frame = error
    record = failure_record(name, frame)
    return record, json.dumps(record, allow_nan=False)
