"""What `dfmp2 run`, `grad` and `optimize` do with their molecules: one molecule (a plain run, a
counterpoise or extrapolated composite, an optimisation), many molecules in one process
(`batch.py`), or a QCSchema input. The click declarations are in `cli.py`.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, fields

import click

from ..chem.extrapolation import check_scf_scheme
from ..kernels import COMMAND_PRECISION
from ..run.context import RunContext
from ..run.ranks import DEFAULT_TIMEOUT_S, fail_unjoined, join_launched_team
from ..run.settings import Settings
from ..util import environment
from ..util.errors import ComputationError, ConvergenceError, InputError
from ..util.files import Outputs, display, one_line
from ..util.scratch import check_scratch, scratch_root
from .batch import frames_of, molecule_sources, named_frames, run_batch
from .progress import Progress
from .report import print_batch_line, print_composite, print_summary
from .signals import guarded, shown

QCSCHEMA_SUFFIX = ".json"


@dataclass(frozen=True)
class JobOptions:
    """The options of `dfmp2 run`, `grad` and `optimize` that are not Settings fields (those
    make the run's Settings, `command_options`): which molecules, the workflow around a run
    (interaction energies, an extrapolated basis's HF, an optimisation), the files written and
    how the command reports."""

    molecules: tuple
    optimize: bool = False  # `dfmp2 optimize` (its own options: output, trajectory, max_steps)
    counterpoise: bool = False
    bsse: str | None = None  # cp, nocp or cp,nocp
    scf_extrapolation: str | None = None  # highest or exponential: a basis in bracket notation only
    rank_timeout: float = DEFAULT_TIMEOUT_S  # under torchrun: how long a rank waits for the others
    json_path: str | None = None
    natorbs_path: str | None = None
    quiet: bool = False
    debug: bool = False
    output: str | None = None  # optimize: the optimised geometry (None: MOLECULE.opt.xyz)
    trajectory: str | None = None  # optimize: every step (None: MOLECULE.traj.xyz)
    max_steps: int = 100  # optimize


SETTINGS_FIELDS = frozenset(field.name for field in fields(Settings))


def settings_options(options: dict) -> dict:
    """The options (click's, by name) that are Settings fields, as given but precision (none
    given: COMMAND_PRECISION, the commands' default): the keyword arguments of the run's Settings."""
    chosen = {name: value for name, value in options.items() if name in SETTINGS_FIELDS}
    if "precision" in chosen:
        chosen["precision"] = chosen["precision"] or COMMAND_PRECISION
    return chosen


def command_options(options: dict, gradient: bool, optimize: bool = False) -> tuple:
    """The options of `dfmp2 run`, `grad` or `optimize` split once: (its JobOptions, the keyword
    arguments of the run's Settings, `settings_options`). properties is a comma-separated list;
    with_rdm1 (--natorbs asks for the density) and gradient (the command) are derived here;
    charge and spin stay None where the command line gives none (the molecule's file decides).
    Every option that is not a Settings field is a JobOptions field (TypeError naming one that is
    neither)."""
    job = JobOptions(optimize=optimize, **{name: value for name, value in options.items()
                                           if name not in SETTINGS_FIELDS})
    settings = settings_options(options)
    settings.update(properties=tuple(settings["properties"].split(",")) if settings["properties"] else (),
                    with_rdm1=job.natorbs_path is not None, gradient=gradient)
    return job, settings


def run_molecules(job: JobOptions, settings_options: dict) -> None:
    """The command's one path from options to the printed summary (`command_options` split them).
    The run's Settings are made once, from `settings_options`, when the outputs are staged and a
    single molecule is read (their checks are then one line, exit 2, as every input error)."""
    paths = list(job.molecules)
    outputs = Outputs(inputs=paths, directories=[settings_options.get("checkpoint")])

    def compute():
        environment.check_values()  # the launch's numbers (ranks, Slurm's memory): one line, exit 2, first
        _stage_outputs(outputs, job, settings_options.get("scratch"))
        schemas = [path for path in paths if path.lower().endswith(QCSCHEMA_SUFFIX)]
        if schemas and len(paths) > 1:
            raise InputError(f"{display(schemas[0])}: a QCSchema input runs alone (one input.json, no other molecules)")
        if schemas:
            return "qcschema", _qcschema(paths[0], job, outputs)
        sources = molecule_sources(paths)
        outputs.protect(sources)  # a directory's molecules are inputs too: never an output
        frames = None
        if len(sources) == 1 and not os.path.isdir(paths[0]):
            from ..chem import read_frames

            frames = read_frames(sources[0], keep_going=True)
            if len(frames) == 1 and isinstance(frames[0], Exception):  # one molecule: bad input is exit 2
                raise frames[0]
        one = frames is not None and len(frames) == 1
        if job.optimize and not one:
            raise InputError("dfmp2 optimize takes one molecule (one frame of one XYZ file)")
        if job.scf_extrapolation is not None:
            check_scf_scheme(job.scf_extrapolation)
        settings = Settings(**settings_options)
        if one:
            return "one", _one_molecule(job, settings, frames[0], outputs)
        entries = frames_of(sources) if frames is None else list(named_frames(sources[0], frames))
        return "batch", _batch(job, settings, entries, outputs)

    kind, record = guarded(lambda: _as_a_rank(compute, job, settings_options), job.debug, outputs)
    if record is None or job.quiet or outputs.to_stdout() or kind == "qcschema":
        return
    if kind == "one":
        shown(lambda: print_composite(record) if "workflow" in record else print_summary(record), job.debug)


def _as_a_rank(compute, job, settings_options):
    """compute(); launched as one of several ranks, an error raised before this rank joined its team
    (an input only it has wrong) is told to the others all the same (`ranks.fail_unjoined`), who would
    wait at the rendezvous for --rank-timeout else. A QCSchema input runs in each process alone."""
    try:
        return compute()
    except Exception as error:
        if not any(path.lower().endswith(QCSCHEMA_SUFFIX) for path in job.molecules):
            fail_unjoined(error, str(settings_options.get("device") or "cpu").strip().lower(),
                          bool(settings_options.get("simulate")), job.rank_timeout)
        raise


def _one_molecule(job, settings, frame, outputs):
    """One frame: a plain run (or optimisation) or a composite; its record (None on ranks > 0)."""
    from ..api.agreement import frame_parts
    from ..api.composite import is_composite, run_composite
    from ..api.driver import frame_settings, run_atoms

    bsse = _bsse_of(job)
    composite = is_composite(settings.basis, bsse)
    _check_extrapolation_option(job, settings.basis)
    team = _joined_team(job, settings)
    root = team is None or team.is_root  # rank 0 prints and writes; the others only compute
    progress = Progress() if (root and not job.quiet and sys.stderr.isatty()) else None
    try:
        if composite:
            if team is not None:
                raise InputError("counterpoise and extrapolated energies run in one process (not under torchrun)")
            if job.optimize or job.natorbs_path is not None:
                raise InputError("counterpoise and extrapolated energies: no --natorbs, grad or optimize")
            result = None
            record = run_composite(frame, settings, bsse, _scf_scheme(job),
                                   lambda: RunContext(progress=progress)).as_dict()
        else:
            settings, notes = frame_settings(frame, settings)
            if job.optimize:
                result, record = _optimized(job, frame, settings, team, progress, outputs)
                record["notes"] += list(notes)
            else:
                result = run_atoms(list(frame.atoms), settings, RunContext(team=team, progress=progress,
                                                                           agreed=frame_parts(frame)), notes=notes)
                record = result.as_dict()
    except Exception as error:
        if team is not None:  # before the ranks agreed on the run: the others are told why (`Team.fail` raises)
            team.fail(error)
        raise
    finally:
        if team is not None:
            team.close()
    if progress:
        progress.clear()
    if not root:
        return None
    if job.natorbs_path is not None:
        occupations, orbitals = result.natural_orbitals()
        outputs.write("--natorbs", lambda path: result.write_molden(path, orbitals, occupations))
        record["natorbs"] = {"path": display(job.natorbs_path), "occupations": occupations.tolist()}
    record.update(molecule=display(job.molecules[0]))
    if not composite:  # (a composite's systems each have theirs)
        record.update(charge=settings.charge, spin=settings.spin)
    if job.json_path is not None:
        outputs.write("--json", lambda path: write_json(path, record))
    outputs.commit()
    return record


def _batch(job, settings, entries, outputs) -> list:
    """Every frame of `entries` ((name, Frame or its reading error), `batch.frames_of`), one after
    another in this process; JSON Lines to --json, each line whole as its molecule finishes.
    ComputationError (exit 1) after the records are written if any molecule failed; at once,
    naming the file and why, if a line cannot be written (a full disk): the batch stops there,
    the lines before it stay whole (a later molecule's result could not be recorded either)."""
    from ..api.composite import is_composite, run_composite
    from ..api.driver import frame_settings, run_atoms

    if job.natorbs_path is not None:
        raise InputError("--natorbs writes one molecule's orbitals: give one molecule")
    if settings.checkpoint is not None:
        raise InputError("--checkpoint keeps one run: give one molecule")
    team = _joined_team(job, settings)
    if team is not None:  # every rank told (`Team.fail`): a rank given one molecule waits for the others
        try:
            team.fail(InputError("several molecules run in one process (not under torchrun)"))  # (raises)
        finally:
            team.close()
    bsse = _bsse_of(job)
    progress = Progress() if (not job.quiet and sys.stderr.isatty()) else None

    composite = is_composite(settings.basis, bsse)
    _check_extrapolation_option(job, settings.basis)

    def compute_frame(frame):
        if composite:
            return run_composite(frame, settings, bsse, _scf_scheme(job),
                                 lambda: RunContext(progress=progress)).as_dict()
        chosen, notes = frame_settings(frame, settings)
        result = run_atoms(list(frame.atoms), chosen, RunContext(progress=progress), notes=notes)
        return {**result.as_dict(), "charge": chosen.charge, "spin": chosen.spin}

    def on_record(record, line):
        if progress:
            progress.clear()
        if job.json_path is not None:  # each molecule's line as it finishes (a signal keeps what is written)
            try:
                outputs.append_line("--json", line)
            except ComputationError as error:  # (a full disk): the batch stops, the lines before stay whole
                raise ComputationError(f"{error}; the batch stopped at {record['molecule']}") from None
        if not job.quiet and not outputs.to_stdout():
            print_batch_line(record)

    records = run_batch(entries, compute_frame, job.debug, on_record)
    outputs.commit()
    failed = [r for r in records if r["status"] != "ok"]
    if failed:
        where = "" if job.json_path is None else (" (their reasons are in "
                                                  + ("the JSON Lines on standard output" if outputs.to_stdout()
                                                     else display(job.json_path)) + ")")
        raise ComputationError(f"{len(failed)} of {len(records)} molecules failed{where}; the first: "
                               f"{failed[0]['molecule']}: {failed[0]['error']}")
    return records


# the options a QCSchema input may come with: its model and keywords say the rest
QCSCHEMA_OPTIONS = ("molecules", "json_path", "quiet", "debug")


def _qcschema(path, job, outputs):
    """A QCSchema AtomicInput file: its AtomicResult (or FailedOperation) to --json (default:
    standard output). A failed one is written too, and the command exits as a run would (its
    error's extras.exit_code: 2 bad input, 1 a failure)."""
    from ..api.qcschema import run_qcschema

    context = click.get_current_context(silent=True)
    given = [name for name in (context.params if context else ()) if name not in QCSCHEMA_OPTIONS
             and context.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
    if given:
        raise InputError(f"{display(path)} is a QCSchema input: its model and keywords set the run; "
                         f"--{given[0].replace('_', '-')} is not taken with it (only --json, --quiet, --debug)")
    try:
        with open(path, encoding="utf-8-sig") as handle:  # (a leading byte-order mark is an encoding mark)
            request = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"{display(path)}: not a readable JSON file ({one_line(str(error))})") from None
    if job.json_path is None:
        outputs.add("--json", "-", stdout_ok=True)
    result = run_qcschema(request)
    outputs.write("--json", lambda p: write_json(p, result))
    outputs.commit()
    if not result.get("success", False):
        error = result.get("error", {})
        message = one_line(error.get("error_message", "the QCSchema computation failed"))
        raise (InputError if (error.get("extras") or {}).get("exit_code") == 2 else ComputationError)(message)
    return result


def _bsse_of(job) -> list:
    """The interaction energies asked for: cp for --counterpoise, then --bsse's list, each once
    (InputError for an empty or unknown kind)."""
    from ..api.composite import check_bsse

    kinds = ["cp"] if job.counterpoise else []
    if job.bsse is not None:
        kinds += check_bsse([k.strip().lower() for k in job.bsse.split(",")])
    return list(dict.fromkeys(kinds))  # in order, each once


def _scf_scheme(job) -> str:
    return job.scf_extrapolation or "highest"


def _check_extrapolation_option(job, basis) -> None:
    """--scf-extrapolation does something only with a basis in bracket notation: InputError otherwise."""
    from ..chem.extrapolation import expand_basis

    if job.scf_extrapolation is not None and len(expand_basis(basis)) == 1:
        raise InputError(f"--scf-extrapolation {job.scf_extrapolation}: the basis {basis} is one basis; it "
                         "extrapolates a basis written in brackets, e.g. cc-pv[tq]z")


def _stage_outputs(outputs, job, scratch) -> None:
    """The files the command will write, checked before anything is computed."""
    if job.optimize:
        outputs.add("--output", job.output or _default_output(job.molecules[0], ".opt.xyz"))
        outputs.add("--trajectory", job.trajectory or _default_output(job.molecules[0], ".traj.xyz"))
    if job.json_path is not None:
        outputs.add("--json", job.json_path, stdout_ok=True)
    if job.natorbs_path is not None:
        outputs.add("--natorbs", job.natorbs_path)
    check_scratch(scratch)  # --scratch, or PySCF_TMPDIR, TMPDIR: one line if it cannot be used
    outputs.staging = scratch_root(scratch)  # (an output to stdout or a FIFO is staged there, never elsewhere)


def _joined_team(job, settings):
    """The torchrun team this process belongs to (None: one process), once the options that
    only the command line has are checked."""
    import math

    if settings.scf_max_cycle < 1:
        raise InputError(f"--scf-max-cycle must be at least 1, got {settings.scf_max_cycle}")
    if not (math.isfinite(job.rank_timeout) and job.rank_timeout > 0):
        raise InputError(f"--rank-timeout must be a positive number of seconds, got {job.rank_timeout:g}")
    return join_launched_team(settings.device, settings.simulate, job.rank_timeout)


def _default_output(molecule, suffix) -> str:
    """MOLECULE's name with `suffix` instead of its extension, in the current directory."""
    return os.path.splitext(os.path.basename(molecule))[0] + suffix


def _optimized(job, frame, settings, team, progress, outputs) -> tuple:
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
        if not job.quiet:
            click.echo(f"  step {k:3d}  E {step.energy:18.10f} Eh{change}  max|g| {abs(step.gradient).max():.2e} "
                       f"Eh/bohr  ({'checkpoint' if step.replayed else f'{step.seconds:.1f} s'})", err=True)

    found = optimize_atoms(list(frame.atoms), settings.replace(checkpoint=None), job.max_steps,
                           settings.checkpoint, settings.checkpoint_allow_other_files, on_step=show, progress=progress,
                           fragments=frame.fragments)
    if not found.converged:
        raise ConvergenceError(f"the geometry did not converge in {job.max_steps} steps (raise --max-steps"
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
