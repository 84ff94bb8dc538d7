"""What `dfmp2 run`, `grad` and `optimize` do with their molecules: one molecule (a plain run, a
counterpoise or extrapolated composite, an optimisation), many molecules in one process
(`batch.py`), or a QCSchema input. The click declarations are in `cli.py`.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import click

from ..chem.extrapolation import check_scf_scheme
from ..kernels import COMMAND_PRECISION
from ..run.context import RunContext
from ..run.ranks import join_launched_team
from ..run.settings import Settings
from ..util.errors import ComputationError, InputError
from ..util.files import Outputs, display, one_line
from ..util.scratch import check_scratch
from .batch import frames_of, molecule_sources, named_frames, run_batch
from .progress import Progress
from .report import print_batch_line, print_composite, print_summary
from .signals import guarded

QCSCHEMA_SUFFIX = ".json"


def run_molecules(gradient, optimize, options) -> None:
    """The command's one path from options to the printed summary. options: the command's
    options by name (`run`'s); optimize: `dfmp2 optimize`'s own, or None."""
    o = SimpleNamespace(**options)
    paths = list(o.molecules)
    outputs = Outputs(inputs=paths, directories=[o.checkpoint])

    def compute():
        _stage_outputs(outputs, o, optimize)
        schemas = [path for path in paths if path.lower().endswith(QCSCHEMA_SUFFIX)]
        if schemas and len(paths) > 1:
            raise InputError(f"{display(schemas[0])}: a QCSchema input runs alone (one input.json, no other molecules)")
        if schemas:
            return "qcschema", _qcschema(paths[0], o, outputs)
        sources = molecule_sources(paths)
        outputs.protect(sources)  # a directory's molecules are inputs too: never an output
        frames = None
        if len(sources) == 1 and not os.path.isdir(paths[0]):
            from ..chem import read_frames

            frames = read_frames(sources[0], keep_going=True)
            if len(frames) == 1 and isinstance(frames[0], Exception):  # one molecule: bad input is exit 2
                raise frames[0]
        if frames is not None and len(frames) == 1:
            return "one", _one_molecule(o, frames[0], gradient, optimize, outputs)
        if optimize is not None:
            raise InputError("dfmp2 optimize takes one molecule (one frame of one XYZ file)")
        entries = frames_of(sources) if frames is None else list(named_frames(sources[0], frames))
        return "batch", _batch(o, entries, gradient, outputs)

    kind, record = guarded(compute, o.debug, outputs)
    if record is None or o.quiet or outputs.to_stdout() or kind == "qcschema":
        return
    if kind == "one":
        print_composite(record) if "workflow" in record else print_summary(record)


def _one_molecule(o, frame, gradient, optimize, outputs):
    """One frame: a plain run (or optimisation) or a composite; its record (None on ranks > 0)."""
    from ..api.composite import is_composite, run_composite
    from ..api.driver import frame_settings, run_atoms

    settings = _settings_of(o, gradient)
    bsse = _bsse_of(o)
    composite = is_composite(settings.basis, bsse)
    _check_extrapolation_option(o)
    team = _joined_team(o)
    root = team is None or team.is_root  # rank 0 prints and writes; the others only compute
    progress = Progress() if (root and not o.quiet and sys.stderr.isatty()) else None
    try:
        if composite:
            if team is not None:
                raise InputError("counterpoise and extrapolated energies run in one process (not under torchrun)")
            if optimize is not None or o.natorbs_path is not None:
                raise InputError("counterpoise and extrapolated energies: no --natorbs, grad or optimize")
            result = None
            record = run_composite(frame, settings, bsse, _scf_scheme(o),
                                   lambda: RunContext(progress=progress)).as_dict()
        else:
            settings, notes = frame_settings(frame, settings)
            if optimize is not None:
                result, record = _optimized(o.molecules[0], frame, settings, team, progress, optimize, outputs,
                                            o.quiet)
                record["notes"] += list(notes)
            else:
                result = run_atoms(list(frame.atoms), settings, RunContext(team=team, progress=progress), notes=notes)
                record = result.as_dict()
    finally:
        if team is not None:
            team.close()
    if progress:
        progress.clear()
    if not root:
        return None
    if o.natorbs_path is not None:
        occupations, orbitals = result.natural_orbitals()
        outputs.write("--natorbs", lambda path: result.write_molden(path, orbitals, occupations))
        record["natorbs"] = {"path": display(o.natorbs_path), "occupations": occupations.tolist()}
    record.update(molecule=display(o.molecules[0]))
    if not composite:  # (a composite's systems each have theirs)
        record.update(charge=settings.charge, spin=settings.spin)
    if o.json_path is not None:
        outputs.write("--json", lambda path: write_json(path, record))
    outputs.commit()
    return record


def _batch(o, entries, gradient, outputs) -> list:
    """Every frame of `entries` ((name, Frame or its reading error), `batch.frames_of`), one after
    another in this process; JSON Lines to --json.
    ComputationError (exit 1) after the records are written if any molecule failed."""
    from ..api.composite import is_composite, run_composite
    from ..api.driver import frame_settings, run_atoms

    if o.natorbs_path is not None:
        raise InputError("--natorbs writes one molecule's orbitals: give one molecule")
    if o.checkpoint is not None:
        raise InputError("--checkpoint keeps one run: give one molecule")
    team = _joined_team(o)
    if team is not None:
        team.close()
        raise InputError("several molecules run in one process (not under torchrun)")
    settings = _settings_of(o, gradient)
    bsse = _bsse_of(o)
    progress = Progress() if (not o.quiet and sys.stderr.isatty()) else None

    composite = is_composite(settings.basis, bsse)
    _check_extrapolation_option(o)

    def compute_frame(frame):
        if composite:
            return run_composite(frame, settings, bsse, _scf_scheme(o),
                                 lambda: RunContext(progress=progress)).as_dict()
        chosen, notes = frame_settings(frame, settings)
        result = run_atoms(list(frame.atoms), chosen, RunContext(progress=progress), notes=notes)
        return {**result.as_dict(), "charge": chosen.charge, "spin": chosen.spin}

    def on_record(record, line):
        if progress:
            progress.clear()
        if o.json_path is not None:  # each molecule's line as it finishes (a signal keeps what is written)
            outputs.append_line("--json", line)
        if not o.quiet and not outputs.to_stdout():
            print_batch_line(record)

    records = run_batch(entries, compute_frame, o.debug, on_record)
    outputs.commit()
    failed = [r for r in records if r["status"] != "ok"]
    if failed:
        where = f" (their reasons are in {display(o.json_path)})" if o.json_path else ""
        raise ComputationError(f"{len(failed)} of {len(records)} molecules failed{where}; the first: "
                               f"{failed[0]['molecule']}: {failed[0]['error']}")
    return records


# the options a QCSchema input may come with: its model and keywords say the rest
QCSCHEMA_OPTIONS = ("molecules", "json_path", "quiet", "debug")


def _qcschema(path, o, outputs):
    """A QCSchema AtomicInput file: its AtomicResult (or FailedOperation) to --json (default:
    standard output). A failed one is written too, and the command exits 2 (input_error) or 1."""
    from ..api.qcschema import run_qcschema

    context = click.get_current_context(silent=True)
    given = [name for name in (context.params if context else ()) if name not in QCSCHEMA_OPTIONS
             and context.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
    if given:
        raise InputError(f"{display(path)} is a QCSchema input: its model and keywords set the run; "
                         f"--{given[0].replace('_', '-')} is not taken with it (only --json, --quiet, --debug)")
    try:
        with open(path, encoding="utf-8") as handle:
            request = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"{display(path)}: not a readable JSON file ({one_line(str(error))})") from None
    if o.json_path is None:
        outputs.add("--json", "-", stdout_ok=True)
    result = run_qcschema(request)
    outputs.write("--json", lambda p: write_json(p, result))
    outputs.commit()
    if not result.get("success", False):
        error = result.get("error", {})
        message = one_line(error.get("error_message", "the QCSchema computation failed"))
        raise (InputError if error.get("error_type") == "input_error" else ComputationError)(message)
    return result


def _bsse_of(o) -> list:
    """The interaction energies asked for: cp for --counterpoise, then --bsse's list, each once
    (InputError for an empty or unknown kind)."""
    from ..api.composite import check_bsse

    kinds = ["cp"] if o.counterpoise else []
    if o.bsse is not None:
        kinds += check_bsse([k.strip().lower() for k in o.bsse.split(",")])
    return list(dict.fromkeys(kinds))  # in order, each once


def _scf_scheme(o) -> str:
    return o.scf_extrapolation or "highest"


def _check_extrapolation_option(o) -> None:
    """--scf-extrapolation does something only with a basis in bracket notation: InputError otherwise."""
    from ..chem.extrapolation import expand_basis

    if o.scf_extrapolation is not None and len(expand_basis(o.basis)) == 1:
        raise InputError(f"--scf-extrapolation {o.scf_extrapolation}: the basis {o.basis} is one basis; it extrapolates "
                         "a basis written in brackets, e.g. cc-pv[tq]z")


def _stage_outputs(outputs, o, optimize) -> None:
    """The files the command will write, checked before anything is computed."""
    if optimize is not None:
        outputs.add("--output", optimize["output"] or _default_output(o.molecules[0], ".opt.xyz"))
        outputs.add("--trajectory", optimize["trajectory"] or _default_output(o.molecules[0], ".traj.xyz"))
    if o.json_path is not None:
        outputs.add("--json", o.json_path, stdout_ok=True)
    if o.natorbs_path is not None:
        outputs.add("--natorbs", o.natorbs_path)
    check_scratch(o.scratch)  # --scratch, or PySCF's temporary directory: one line if it cannot be used


def _joined_team(o):
    """The torchrun team this process belongs to (None: one process), once the options that
    only the command line has are checked."""
    import math

    if o.scf_max_cycle < 1:
        raise InputError(f"--scf-max-cycle must be at least 1, got {o.scf_max_cycle}")
    if not (math.isfinite(o.rank_timeout) and o.rank_timeout > 0):
        raise InputError(f"--rank-timeout must be a positive number of seconds, got {o.rank_timeout:g}")
    return join_launched_team(o.device, o.simulate, o.rank_timeout)


def _settings_of(o, gradient) -> Settings:
    """The run's Settings from the command's options (--natorbs asks for the density); charge and
    spin None where the command line gives none (the molecule's file decides)."""
    if o.scf_extrapolation is not None:
        check_scf_scheme(o.scf_extrapolation)
    return Settings(basis=o.basis, auxbasis=o.auxbasis, jk_auxbasis=o.jk_auxbasis, cartesian=o.cartesian, ecp=o.ecp,
                    charge=o.charge, spin=o.spin, reference=o.reference, scf=o.scf, scf_max_cycle=o.scf_max_cycle,
                    scf_backend=o.scf_backend, scf_precision=o.scf_precision, screening=o.screening,
                    frozen_core=o.frozen_core, xc=o.xc, c_os=o.c_os, c_ss=o.c_ss,
                    with_rdm1=o.natorbs_path is not None, device=o.device,
                    precision=o.precision or COMMAND_PRECISION, simulate=o.simulate, nki_api=o.nki_api,
                    transform=o.transform, max_memory=o.max_memory, scratch=o.scratch, checkpoint=o.checkpoint,
                    checkpoint_allow_other_files=o.checkpoint_allow_other_files,
                    properties=tuple(o.properties.split(",")) if o.properties else (), gradient=gradient)


def _default_output(molecule, suffix) -> str:
    """MOLECULE's name with `suffix` instead of its extension, in the current directory."""
    return os.path.splitext(os.path.basename(molecule))[0] + suffix


def _optimized(molecule, frame, settings, team, progress, options, outputs, quiet) -> tuple:
    """`dfmp2 optimize`: (the final run's result, the JSON record) with both files staged; one
    line per step on stderr (unless --quiet). Not converged: ComputationError (exit 1)."""
    from ..chem import format_xyz
    from .optimize import optimize_atoms

    if team is not None:
        raise InputError("dfmp2 optimize runs in one process (not under torchrun)")
    energies = []

    def show(k, step):
        if progress:
            progress.clear()
        change = f"  dE {step.energy - energies[-1]:+.3e}" if energies else ""
        energies.append(step.energy)
        if not quiet:
            click.echo(f"  step {k:3d}  E {step.energy:18.10f} Eh{change}  max|g| {abs(step.gradient).max():.2e} "
                       f"Eh/bohr  ({'checkpoint' if step.replayed else f'{step.seconds:.1f} s'})", err=True)

    found = optimize_atoms(list(frame.atoms), settings.replace(checkpoint=None), options["max_steps"],
                           settings.checkpoint, settings.checkpoint_allow_other_files, on_step=show, progress=progress,
                           fragments=frame.fragments)
    if not found.converged:
        raise ComputationError(f"the geometry did not converge in {options['max_steps']} steps (raise --max-steps"
                               + ("; the same --checkpoint resumes)" if settings.checkpoint else ")"))
    output, trajectory = outputs.path("--output"), outputs.path("--trajectory")
    outputs.write("--output", lambda path: write_text(path, format_xyz([(
        f"dfmp2 optimised geometry  E = {found.energies[found.final_step]:.12f} Eh", found.atoms, frame.fragments)])))
    outputs.write("--trajectory", lambda path: write_text(path, format_xyz(found.frames())))
    record = {**found.final.as_dict(), **found.as_dict(), "optimized_xyz": display(output),
              "trajectory": display(trajectory)}
    record["notes"] = list(found.final.notes) + list(found.notes)
    return found.final, record


def write_text(path, text):
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def write_json(path, record):
    """The record as JSON at `path`; NaN or infinity is an error, not invalid JSON."""
    with open(path, "w", encoding="utf-8") as out:
        json.dump(record, out, indent=2, allow_nan=False)
        out.write("\n")
