"""Command line: `dfmp2 run`, `dfmp2 info`. Parses, calls, prints; the only module that prints.

Exit status: 0 success, 2 bad input (one line on stderr), 1 runtime failure (one line).
`--debug` shows the traceback instead.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time

import click

from .. import __version__
from ..util.errors import DFMP2Error, InputError, command_line_names
from ..util.files import Outputs, check_scratch, display, one_line
from ..run.ranks import DEFAULT_TIMEOUT_S, join_launched_team
from ..run.context import RunContext
from ..kernels import COMMAND_PRECISION
from ..run.settings import Settings

DEVICE_CHOICES = "cpu|cuda|trn1|trn2"
SEED_MAX = 2**64 - 1  # the Philox key is 64 bits


def _fail(message: str, code: int):
    click.echo(f"dfmp2: error: {one_line(message)}", err=True)  # one line, whatever a name or a library put in it
    sys.exit(code)


class _SignalExit(SystemExit):
    """Exit status 128 + N after a signal, once cleanup has run (main leaves with os._exit)."""


def _stop(message: str, code: int):
    click.echo(f"dfmp2: error: {one_line(message)}", err=True)
    raise _SignalExit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, invoke_without_command=True)
@click.version_option(__version__, prog_name="dfmp2")
@click.pass_context
def cli(ctx):
    """Density-fitted MP2 (RI-MP2) correlation energies on CPUs, NVIDIA GPUs and Trainium."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


# shared by `run` and `bench`
NKI_API_OPTION = click.option(
    "--nki-api", default=None, metavar="0.2|0.3|0.4|0.5|0.6",
    help="With --simulate: the NKI release whose rules the emulator applies "
         "[default: the newest AWS documents for the target: 0.2 on trn1, 0.6 on trn2].")
TRANSFORM_OPTION = click.option(
    "--transform", default=None, metavar="exact|fp32",
    help="trn1/trn2: the AO->MO transform's arithmetic: exact products of 7-bit slices (1 uEh; the "
         "default) or plain fp32 products (faster; 1e-7 to 1e-3 Eh off on real molecules, see docs/trainium.md).")


@cli.command()
@click.argument("molecule", metavar="MOLECULE.xyz")
@click.option("--basis", default="cc-pvdz", show_default=True, help="Orbital basis: any name in PySCF's library or the Basis Set Exchange's data.")
@click.option("--auxbasis", default=None,
              help="MP2 auxiliary basis [default: the MP2-fit/RI set for --basis].")
@click.option("--ecp", default="auto", show_default=True, metavar="auto|none|NAME",
              help="Effective core potentials: auto uses those the basis carries (def2: Rb-Rn, as Psi4, ORCA "
                   "and Turbomole do); none runs every atom all-electron; or an ECP library's name.")
@click.option("--charge", type=int, default=0, show_default=True, help="Molecular charge.")
@click.option("--spin", type=int, default=0, show_default=True,
              help="2S (number of unpaired electrons); > 0 runs UHF unless --reference says otherwise.")
@click.option("--reference", default=None, metavar="rhf|uhf|rohf",
              help="SCF reference [default: rhf for --spin 0, uhf otherwise]; rohf gives ROHF-MBPT(2) "
                   "on semicanonical orbitals, singles included (as Psi4).")
@click.option("--xc", default=None, metavar="NAME",
              help="Double-hybrid DFT: B2PLYP, B2GPPLYP, DSD-BLYP, DSD-PBEP86, DSD-PBEPBE, PBE0-DH, PBE0-2, "
                   "or a PySCF xc string for the KS part with --c-os/--c-ss. E = E_KS + c_os E_os + c_ss E_ss.")
@click.option("--c-os", type=float, default=None, help="With a custom --xc: the opposite-spin MP2 scaling.")
@click.option("--c-ss", type=float, default=None, help="With a custom --xc: the same-spin MP2 scaling.")
@click.option("--frozen-core", is_flag=True, help="Freeze the usual core orbitals of each element.")
@click.option("--scf", type=click.Choice(["df", "exact"]), default="df", show_default=True,
              help="SCF with density fitting (JK-fit basis) or exact four-center integrals.")
@click.option("--scf-backend", default=None, metavar="device|pyscf",
              help="Who builds the density-fitted SCF's Coulomb and exchange matrices: device (dfmp2's builds "
                   "on --device; the default) or pyscf (PySCF's own; the default with --scf exact and "
                   "range-separated functionals).")
@click.option("--scf-precision", default=None, metavar="mixed|fp64",
              help="dfmp2's SCF builds: mixed (default: fp32 builds while the density moves, then fp64 anchors "
                   "plus fp32 increments; on trn1/trn2 exact-product anchors; converges to the fp64 energy) "
                   "or fp64 throughout (cpu, cuda).")
@click.option("--screening", default="auto", show_default=True, metavar="off|auto|THRESHOLD",
              help="Schwarz screening of the three-center integrals (mn|P): only the kept AO-pair blocks are "
                   "computed, stored and transformed (SCF builds and MP2; trn1/trn2: the MP2 transform only). "
                   "auto: at 1e-10 where it pays (extended molecules); a threshold such as 1e-10: always; off: dense.")
@click.option("--device", default="cpu", show_default=True, metavar=DEVICE_CHOICES,
              help="Where the MP2 kernels (and the SCF's builds) run.")
@click.option("--precision", default=None, metavar="fp32|fp64",
              help="The MP2 step's GEMM precision [default: fp32, within 0.1 uEh of fp64; energy sums "
                   "are fp64]; fp64 (cpu, cuda) keeps every GEMM in fp64. (The tensor-core modes "
                   "tf32x3/bf16x3 are for `dfmp2 bench` only: docs/gpu.md.)")
@click.option("--simulate", is_flag=True,
              help="trn1/trn2: run the NKI kernels on dfmp2's emulator (target limits enforced).")
@NKI_API_OPTION
@TRANSFORM_OPTION
@click.option("--max-memory", type=float, default=None, metavar="MB",
              help="Memory budget in MB [default: 80% of available RAM].")
@click.option("--scratch", default=None, metavar="DIR",
              help="Directory for the scratch file used when (ia|P) exceeds the budget.")
@click.option("--checkpoint", default=None, metavar="DIR",
              help="Keep the SCF, B and finished pair blocks in DIR; the same command with the same DIR "
                   "resumes from them (a different run is refused).")
@click.option("--checkpoint-allow-other-files", is_flag=True,
              help="Use a --checkpoint directory that already holds other files (without a dfmp2 manifest): "
                   "dfmp2 writes beside them and never reads, replaces or deletes them.")
@click.option("--rank-timeout", type=float, default=DEFAULT_TIMEOUT_S, show_default=True, metavar="SECONDS",
              help="Under torchrun: how long a rank waits for the others (the SCF on rank 0 included) "
                   "before it gives up with an error.")
@click.option("--scf-max-cycle", type=int, default=100, show_default=True,
              help="SCF iterations before giving up (exit 1).")
@click.option("--json", "json_path", default=None, metavar="PATH", help="Write the results as JSON.")
@click.option("--natorbs", "natorbs_path", default=None, metavar="FILE.molden",
              help="Write the unrelaxed MP2 natural orbitals and occupations (RHF; UHF: of the spin-summed density).")
@click.option("--properties", default=None, metavar="dipole",
              help="Properties from the relaxed MP2 density (Z-vector; RHF and UHF, cpu and cuda): dipole "
                   "(a.u., nuclei included, the input's frame).")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
def run(**options):
    """DF-MP2 energy of the molecule in MOLECULE.xyz (Angstrom)."""
    _run_molecule(False, **options)


def _grad(**options):
    """DF-MP2 energy and analytic nuclear gradient of the molecule in MOLECULE.xyz (Angstrom):
    dE/dR per atom in Eh/bohr, the input's frame and atom order (RHF and UHF references, RKS
    double hybrids). --precision defaults to fp32 as for `run` (the pair stage's GEMMs; its sums and the
    gradient's own GEMMs are fp64): within 5e-9 Eh/bohr of fp64 on cpu (docs/method.md)."""
    _run_molecule(True, **options)


def _optimize(output, trajectory, max_steps, **options):
    """Optimise the geometry of the molecule in MOLECULE.xyz (Angstrom) with geomeTRIC on the
    analytic DF-MP2 gradient (RHF and UHF; PySCF's default convergence criteria). Writes the
    optimised geometry (--output) and every step (--trajectory), one line per step on stderr;
    --checkpoint DIR keeps the finished steps, and the same command resumes from them."""
    _run_molecule(True, optimize={"output": output, "trajectory": trajectory, "max_steps": max_steps}, **options)


def _run_molecule(gradient, molecule, basis, auxbasis, ecp, charge, spin, reference, xc, c_os, c_ss, frozen_core, scf,
                  scf_backend, scf_precision, screening, device, precision, simulate, nki_api, transform, max_memory,
                  scratch, checkpoint, checkpoint_allow_other_files, rank_timeout, scf_max_cycle, json_path,
                  natorbs_path, properties, quiet, debug, optimize=None):
    """`dfmp2 run` (gradient False), `dfmp2 grad` (True) and `dfmp2 optimize` (optimize: its
    options): one code path."""
    from ..api.driver import run_xyz

    outputs = Outputs(inputs=[molecule], directories=[checkpoint])

    def compute():
        if optimize is not None:
            outputs.add("--output", optimize["output"] or _default_output(molecule, ".opt.xyz"))
            outputs.add("--trajectory", optimize["trajectory"] or _default_output(molecule, ".traj.xyz"))
        if json_path is not None:
            outputs.add("--json", json_path, stdout_ok=True)
        if natorbs_path is not None:
            outputs.add("--natorbs", natorbs_path)
        check_scratch(scratch)  # --scratch, or PySCF's temporary directory: one line if it cannot be used
        if scf_max_cycle < 1:
            raise InputError(f"--scf-max-cycle must be at least 1, got {scf_max_cycle}")
        if not (math.isfinite(rank_timeout) and rank_timeout > 0):
            raise InputError(f"--rank-timeout must be a positive number of seconds, got {rank_timeout:g}")
        team = join_launched_team(device, simulate, rank_timeout)
        root = team is None or team.is_root  # rank 0 prints and writes; the others only compute
        progress = _Progress() if (root and not quiet and sys.stderr.isatty()) else None
        settings = Settings(basis=basis, auxbasis=auxbasis, ecp=ecp, charge=charge, spin=spin, reference=reference,
                            scf=scf, scf_max_cycle=scf_max_cycle, scf_backend=scf_backend,
                            scf_precision=scf_precision, screening=screening, frozen_core=frozen_core, xc=xc,
                            c_os=c_os, c_ss=c_ss, with_rdm1=natorbs_path is not None, device=device,
                            precision=precision or COMMAND_PRECISION, simulate=simulate, nki_api=nki_api,
                            transform=transform, max_memory=max_memory, scratch=scratch, checkpoint=checkpoint,
                            checkpoint_allow_other_files=checkpoint_allow_other_files,
                            properties=tuple(properties.split(",")) if properties else (), gradient=gradient)
        try:
            if optimize is not None:
                result, record = _optimized(molecule, settings, team, progress, optimize, outputs, quiet)
            else:
                result = run_xyz(molecule, settings, RunContext(team=team, progress=progress))
                record = result.as_dict()
        finally:
            if team is not None:
                team.close()
        if progress:
            progress.clear()
        if not root:
            return None
        if natorbs_path is not None:
            import numpy as np

            from ..chem import overlap_matrix, write_molden
            from ..mp2.steps import natural_orbitals

            mf = result.mean_field
            occupations, orbitals = natural_orbitals(result.make_rdm1(mf.mo_coeff, mf.mo_occ), np.asarray(mf.mo_coeff),
                                                     overlap_matrix(mf.mol))
            outputs.write("--natorbs", lambda path: write_molden(mf.mol, path, orbitals, occupations))
            record["natorbs"] = {"path": display(natorbs_path), "occupations": occupations.tolist()}
        record["molecule"] = display(molecule)
        record["charge"] = charge
        record["spin"] = spin
        if json_path is not None:
            outputs.write("--json", lambda path: _write_json(path, record))
        outputs.commit()
        return record

    record = _guarded(compute, debug, outputs)
    if record is not None and not quiet and not outputs.to_stdout():
        _print_summary(record)


cli.add_command(click.Command("grad", callback=_grad, params=list(run.params), help=_grad.__doc__,
                              context_settings={"help_option_names": ["-h", "--help"]}))
cli.add_command(click.Command("optimize", callback=_optimize, help=_optimize.__doc__,
                              context_settings={"help_option_names": ["-h", "--help"]}, params=[
    *[p if p.name != "checkpoint" else click.Option(
        ["--checkpoint"], default=None, metavar="DIR",
        help="Keep every finished optimisation step in DIR; the same command with the same DIR replays them "
             "and goes on (another optimisation's DIR is refused).") for p in run.params],
    click.Option(["--output"], default=None, metavar="FILE.xyz",
                 help="The optimised geometry [default: MOLECULE.opt.xyz in the current directory]."),
    click.Option(["--trajectory"], default=None, metavar="FILE.xyz",
                 help="Every step's geometry, energy and largest gradient component, in order (a multi-frame "
                      "XYZ) [default: MOLECULE.traj.xyz in the current directory]."),
    click.Option(["--max-steps"], type=int, default=100, show_default=True,
                 help="Optimisation steps (geomeTRIC iterations, PySCF's maxsteps; the start is evaluated besides) "
                      "before giving up (exit 1; a --checkpoint keeps the steps)."),
]))


def _default_output(molecule, suffix) -> str:
    """MOLECULE's name with `suffix` instead of its extension, in the current directory."""
    return os.path.splitext(os.path.basename(molecule))[0] + suffix


def _optimized(molecule, settings, team, progress, options, outputs, quiet) -> tuple:
    """`dfmp2 optimize`: (the final run's result, the JSON record) with both files staged; one
    line per step on stderr (unless --quiet). Not converged: ComputationError (exit 1)."""
    from ..chem import format_xyz, read_xyz
    from ..util.errors import ComputationError
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

    found = optimize_atoms(read_xyz(molecule), settings.replace(checkpoint=None), options["max_steps"],
                           settings.checkpoint, settings.checkpoint_allow_other_files, on_step=show, progress=progress)
    if not found.converged:
        raise ComputationError(f"the geometry did not converge in {options['max_steps']} steps (raise --max-steps"
                               + ("; the same --checkpoint resumes)" if settings.checkpoint else ")"))
    output, trajectory = outputs.path("--output"), outputs.path("--trajectory")
    outputs.write("--output", lambda path: _write_text(path, format_xyz([(
        f"dfmp2 optimised geometry  E = {found.energies[found.final_step]:.12f} Eh", found.atoms)])))
    outputs.write("--trajectory", lambda path: _write_text(path, format_xyz(found.frames())))
    record = {**found.final.as_dict(), **found.as_dict(), "optimized_xyz": display(output),
              "trajectory": display(trajectory)}
    record["notes"] = list(found.final.notes) + list(found.notes)
    return found.final, record


def _write_text(path, text):
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


@cli.command()
@click.option("--shape", default=None, metavar="small|medium|large",
              help="A published benchmark shape (nbasis/nocc/naux 128/16/384, 512/64/1536, 768/96/2304).")
@click.option("--nbasis", type=int, default=None, help="Basis functions (instead of --shape).")
@click.option("--nocc", type=int, default=None, help="Occupied orbitals (instead of --shape).")
@click.option("--naux", type=int, default=None, help="Auxiliary functions (instead of --shape).")
@click.option("--seed", type=click.IntRange(0, SEED_MAX), default=0, show_default=True,
              help="Philox seed of the synthetic problem (0 to 2^64 - 1).")
@click.option("--kernel", default=None, metavar="gemm|syrk|trsm|ao2mo|pair_energy",
              help="Instead of the pipeline: the MODELLED warm time of one NKI kernel call at --size "
                   "(with --device trn1|trn2 --simulate).")
@click.option("--size", type=int, default=None, help="With --kernel: the problem size N.")
@click.option("--device", default="cpu", show_default=True, metavar=DEVICE_CHOICES)
@click.option("--simulate", is_flag=True, help="trn1/trn2: run the NKI kernels on the emulator.")
@click.option("--model-only", is_flag=True,
              help="With --simulate: emulate each kernel shape once (for the modelled time of large "
                   "shapes); repeated calls use host reference math.")
@NKI_API_OPTION
@TRANSFORM_OPTION
@click.option("--precision", default=None, metavar="fp32|fp64|tf32x3|bf16x3",
              help="GEMM precision [default: fp32; fp64, tf32x3 and bf16x3 on cpu and cuda only].")
@click.option("--repeat", type=int, default=3, show_default=True, help="Warm passes after the cold one (0: time the cold pass).")
@click.option("--integrals", default="host", show_default=True, metavar="host|device",
              help="Where the synthetic (mn|P) blocks are made: host (uploaded block by block, as PySCF's "
                   "integrals are) or device (on the GPU, --device cuda only: the kernel layer without the upload).")
@click.option("--max-memory", type=float, default=None, metavar="MB", help="Memory budget in MB.")
@click.option("--json", "json_path", default=None, metavar="PATH", help="Write the results as JSON.")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
def bench(shape, nbasis, nocc, naux, seed, kernel, size, device, simulate, model_only, nki_api, transform,
          precision,
          repeat, integrals, max_memory, json_path, quiet, debug):
    """Time the DF-MP2 pipeline on a synthetic problem (same seed: same problem on every device),
    or model one NKI kernel call (--kernel)."""
    from .bench import resolve_shape, run_bench, run_kernel_bench

    outputs = Outputs()

    def compute():
        if json_path is not None:
            outputs.add("--json", json_path, stdout_ok=True)
        if kernel is not None or size is not None:
            if kernel is None or size is None:
                raise InputError("--kernel and --size go together")
            if any(v is not None for v in (shape, nbasis, nocc, naux)) or model_only or integrals != "host":
                raise InputError("--kernel models one kernel call: no --shape/--nbasis/--nocc/--naux/--model-only/"
                                 "--integrals")
            record = run_kernel_bench(kernel, size, device, simulate, nki_api, seed)
        else:
            sizes = resolve_shape(shape, nbasis, nocc, naux)
            progress = _Progress() if (not quiet and sys.stderr.isatty()) else None
            settings = Settings(device=device, precision=precision or COMMAND_PRECISION, simulate=simulate,
                                model_only=model_only,
                                nki_api=nki_api, transform=transform, max_memory=max_memory)
            record = run_bench(*sizes, seed=seed, repeat=repeat, settings=settings, progress=progress,
                               integrals=integrals)
            if progress:
                progress.clear()
            record["shape"]["name"] = shape
        if json_path is not None:
            outputs.write("--json", lambda path: _write_json(path, record))
        outputs.commit()
        return record

    record = _guarded(compute, debug, outputs)
    if not quiet and not outputs.to_stdout():
        _print_kernel_bench(record) if "kernel" in record else _print_bench(record)


class _Terminated(BaseException):
    """SIGTERM (or SIGHUP), raised in the main thread so that cleanup (finally blocks) runs."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


_SIGNALS_RECEIVED = []  # the stopping signals seen, in order (a library may turn the exception into another)


def _raise_terminated(signum, frame):
    _SIGNALS_RECEIVED.append(signum)
    for other in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # a second signal must not cut the cleanup
        signal.signal(other, signal.SIG_IGN)
    raise KeyboardInterrupt if signum == signal.SIGINT else _Terminated(signum)


def _stop_for_signal(signum):
    if signum == signal.SIGINT:
        _stop("interrupted (SIGINT); scratch removed", 128 + signal.SIGINT)
    _stop(f"stopped by {signal.Signals(signum).name}; scratch removed", 128 + signum)


def _guarded(compute, debug, outputs):
    """Run `compute`; errors become one line (exit 2 bad input, 1 failure) unless --debug.
    SIGINT, SIGTERM and SIGHUP stop the run: scratch files are removed on the way out (a
    --checkpoint directory is kept), no output file is written, exit 128 + signal number.
    `outputs` staged but not committed are discarded whatever happens."""
    stopping = [signum for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
                if signal.getsignal(signum) is not signal.SIG_IGN]  # an inherited ignore (nohup) is respected
    _SIGNALS_RECEIVED.clear()
    for signum in stopping:
        signal.signal(signum, _raise_terminated)
    try:
        record = compute()
        for signum in stopping:  # the outputs are in place: the run has succeeded, whatever comes now
            signal.signal(signum, signal.SIG_IGN)
        return record
    except DFMP2Error as error:
        if debug:
            raise
        if getattr(error, "reported_by_rank0", False):  # rank 0 says it once for every rank
            sys.exit(error.exit_code)
        _fail(str(error), error.exit_code)
    except KeyboardInterrupt:
        _stop_for_signal(signal.SIGINT)
    except _Terminated as stop:
        _stop_for_signal(stop.signum)
    except (click.exceptions.Exit, click.ClickException):
        raise
    except Exception as error:  # an unexpected failure: one line (exit 1), traceback only with --debug
        if _SIGNALS_RECEIVED and not debug:  # the signal surfaced as another error (e.g. a C extension's
            _stop_for_signal(_SIGNALS_RECEIVED[0])  # module init turns it into "ImportError: initialization failed")
        if debug:
            raise
        _fail(f"{type(error).__name__}: {error} (rerun with --debug for the traceback)", 1)
    finally:
        outputs.discard()


@cli.command()
def info():
    """Versions, and which devices can run on this machine."""
    import platform

    from ..kernels import device_report

    from ..util.files import package_versions

    versions = {"dfmp2": __version__, "python": platform.python_version()}
    for package, version in package_versions(("torch", "pyscf", "numpy", "h5py", "click", "torch-neuronx",
                                              "torch-xla", "neuronx-cc", "nki")).items():
        versions[package] = version or "not installed"
    for name, version in versions.items():
        click.echo(f"{name:14s} {version}")
    click.echo("devices:")
    for device, (usable, detail) in device_report().items():
        click.echo(f"  {device:6s} {'usable' if usable else 'unavailable':12s} {detail}")


def _write_json(path, record):
    """The record as JSON at `path`; NaN or infinity is an error, not invalid JSON."""
    with open(path, "w", encoding="utf-8") as out:
        json.dump(record, out, indent=2, allow_nan=False)
        out.write("\n")


class _Progress:
    """One status line on stderr, rewritten in place (terminals only): at most every `interval`
    seconds (and when a step completes), with the step's elapsed time and, once it has run a
    second, its ETA. total None: a step of unknown length (the SCF's cycles)."""

    def __init__(self, interval=0.25, clock=time.monotonic, write=None):
        self.interval, self.clock = interval, clock
        self.write = write or (lambda text: click.echo(text, err=True, nl=False))
        self._step, self._start, self._last = None, 0.0, float("-inf")
        self.redraws = 0

    def __call__(self, step, done, total=None):
        now = self.clock()
        if step != self._step:
            self._step, self._start = step, now
        if (total is None or done < total) and now - self._last < self.interval:
            return
        self._last = now
        elapsed = now - self._start
        if total is None:
            text = f"{step}: {done} ({elapsed:.0f} s)"
        else:
            eta = f", ETA {elapsed * (total - done) / done:.0f} s" if 0 < done < total and elapsed >= 1 else ""
            text = f"{step}: {done}/{total} ({100 * done / max(total, 1):.0f}%, {elapsed:.0f} s{eta})"
        self.write(f"\r  {text}\x1b[K")
        self.redraws += 1

    def clear(self):
        self.write("\r\x1b[K")


def _print_summary(r):
    kernels = ", ".join(f"{name} x{count}" for name, count in sorted(r["kernels"].items()))
    def spins(value):  # an int (RHF) or [alpha, beta]
        return f"{value[0]}a/{value[1]}b" if isinstance(value, list) else f"{value}"

    frozen = f" ({spins(r['nfrozen'])} frozen)" if r["nfrozen"] not in (0, [0, 0]) else ""
    reference = r["reference"].upper() + (f", <S^2> {r['spin_square']:.4f}" if r["reference"] != "rhf" else "")
    scf = r["scf"] + (f" (JK-fit: {r['scf_auxbasis']})" if r["scf_auxbasis"] else "")
    mem = r["memory"]
    lines = [
        f"dfmp2 {r['version']}: DF-MP2 (RI-MP2) correlation energy",
        f"  molecule    {r['formula']} from {r['molecule']}, charge {r['charge']}, 2S {r['spin']}",
        f"  basis       {r['basis']}, MP2 auxiliary basis {r['auxbasis']}, SCF {scf}",
        *([f"  ecp         " + ", ".join(f"{el}: {e['name']} ({e['core_electrons']} core electrons)"
                                      for el, e in sorted(r["ecp"].items()))] if r.get("ecp") else []),
        f"  reference   {reference}",
        *_scf_lines(r),
        f"  sizes       nbasis {r['nbasis']}, nocc {spins(r['nocc'])}{frozen}, nvir {spins(r['nvir'])}, "
        f"naux {r['naux']}",
        f"  device      {r['device']} ({r['device_description']}), {r['backend']} backend, {r['precision']}, "
        f"transform {r['transform']}",
        *([f"  nki         {r['nki_api']}"] if r.get("nki_api") else []),
        *[f"  note        {note}" for note in r.get("notes", [])],
        f"  kernels     {kernels}",
        f"  metric      {r['metric_factorization']}",
        f"  memory      budget {mem['budget_mb']:.0f} MB (process; {mem['baseline_mb']:.0f} MB resident before "
        f"MP2, peak {mem['peak_rss_mb']:.0f} MB), (ia|P) in {mem['storage']}, aux block {mem['aux_block']}, "
        f"occ block {mem['occ_block']}",
        *_checkpoint_lines(r.get("checkpoint")),
        *_rank_lines(r.get("distributed")),
        "",
        f"  {'E(' + r['reference'].upper() + ')':17s} {r['e_ref']:20.12f} Eh"
        + (f" ({r['xc']})" if r.get("xc") else ""),
        f"  E(corr, os)       {r['e_corr_os']:20.12f} Eh",
        f"  E(corr, ss)       {r['e_corr_ss']:20.12f} Eh",
        *([f"  E(corr, singles)  {r['e_corr_singles']:20.12f} Eh"] if r["reference"] == "rohf" else []),
        f"  E(corr)           {r['e_corr']:20.12f} Eh",
        f"  E(corr, SCS)      {r['e_scs']:20.12f} Eh",
        *([f"  E(PT2)            {r['e_pt2']:20.12f} Eh  = {r['c_os']:g} E(os) + {r['c_ss']:g} E(ss) "
           f"({r['xc']}: {r['xc_citation']})"] if r.get("e_pt2") is not None else []),
        f"  E(total)          {r['e_tot']:20.12f} Eh" + ("  = E(KS) + E(PT2)" if r.get("e_pt2") is not None else ""),
        *([f"  dipole (relaxed)  {r['dipole'][0]:12.6f} {r['dipole'][1]:12.6f} {r['dipole'][2]:12.6f} a.u."]
          if r.get("dipole") else []),
        *_gradient_lines(r.get("gradient"), r.get("atoms")),
        *_optimization_lines(r),
        "",
        "  timings (s)  " + "  ".join(f"{k} {v:.3f}" for k, v in r["timings"].items()),
    ]
    lines += _model_lines(r, scale=1e3, unit="ms")
    if r.get("kernel_specializations"):
        lines.append("  kernel specializations: " + ", ".join(
            f"{k} x{len(v)}" for k, v in sorted(r["kernel_specializations"].items())))
    click.echo("\n".join(lines))


def _optimization_lines(r):
    """`dfmp2 optimize`: steps, energy change, and the files written."""
    if "energies" not in r:
        return []
    replayed = f", {r['steps_replayed']} from the checkpoint" if r["steps_replayed"] else ""
    return ["", f"  optimised   converged in {r['steps']} steps{replayed}: E {r['energies'][0]:.10f} -> "
                f"{r['e_tot']:.10f} Eh ({r['e_tot'] - r['energies'][0]:+.3e})",
            f"  written     {r['optimized_xyz']} (geometry), {r['trajectory']} (trajectory)"]


def _gradient_lines(gradient, atoms):
    """The analytic gradient table (Eh/bohr), one row per atom in the input's order."""
    if gradient is None:
        return []
    rows = [f"  {k + 1:4d} {symbol:3s} {g[0]:16.10f} {g[1]:16.10f} {g[2]:16.10f}"
            for k, (symbol, g) in enumerate(zip(atoms, gradient))]
    return ["", "  gradient dE/dR (Eh/bohr)      x                y                z", *rows]


def _scf_lines(r):
    """The SCF's J/K builds: who ran them, in which precision, iterations and seconds."""
    if r.get("scf_backend") is None:
        return []
    line = f"  scf builds  {r['scf_backend']}, {r['scf_precision']}"
    if r.get("scf_iterations") is not None:
        line += f", {r['scf_iterations']} iterations"
    builds = r.get("scf_builds")
    if builds:
        kinds = ", ".join(f"{builds[k + '_builds']} {k}" for k in ("fp32", "incremental", "fp64", "exact", "coulomb")
                          if builds.get(k + "_builds"))
        line += (f"; {builds['builds']} builds ({kinds}), {sum(builds['build_seconds']):.2f} s, set-up "
                 f"{builds['setup_seconds']:.2f} s, B as {builds['storage']}")
        if builds.get("modelled_build_seconds"):
            line += "; MODELLED builds " + ", ".join(f"{t} {sum(v) * 1e3:.1f} ms" for t, v in
                                                   builds["modelled_build_seconds"].items()) + " (a model)"
    return [line]


def _checkpoint_lines(ck):
    if not ck:
        return []
    reused = [name for name, key in (("SCF", "reused_scf"), ("B", "reused_B")) if ck.get(key)]
    if ck["reused_pair_tasks"]:
        reused.append(f"{ck['reused_pair_tasks']}/{ck['pair_tasks']} pair blocks")
    return [f"  checkpoint  {ck['directory']} (reused: {', '.join(reused) or 'nothing, new'})"]


def _rank_lines(distributed):
    if not distributed:
        return []
    lines = [f"  ranks       {distributed['ranks']} ({distributed['backend']}); per rank:"]
    for r in distributed["per_rank"] or []:
        lines.append(f"    rank {r['rank']}: {r['pair_tasks']} pair blocks in {r['pair_seconds']:.2f} s, "
                     f"{r['aux_functions']} aux functions, sent {r['bytes_sent'] / 1e6:.1f} MB, "
                     f"received {r['bytes_received'] / 1e6:.1f} MB, peak {r['peak_rss_mb']:.0f} MB")
    return lines


def _print_bench(r):
    s = r["shape"]
    name = f"{s['name']} " if s.get("name") else ""
    lines = [
        f"dfmp2 {r['versions']['dfmp2']} bench: synthetic DF-MP2, {name}nbasis {s['nbasis']}, "
        f"nocc {s['nocc']}, nvir {s['nvir']}, naux {s['naux']}, seed {s['seed']}",
        f"  device      {r['device']} ({r['device_description']}), {r['backend']} backend, {r['precision']}, "
        f"transform {r['transform']}",
        f"  integrals   synthetic (mn|P) made on "
        f"{'the GPU' if r['integrals_made_on'] == 'cuda' else 'the host' + (', uploaded' if r['device'] != 'cpu' else '')}",
        *[f"  note        {note}" for note in r.get("notes", [])],
        f"  E(corr)     {r['e_corr']:.12f} Eh (os {r['e_corr_os']:.10f}, ss {r['e_corr_ss']:.10f})",
        "",
        f"  {'stage':15s} {'seconds':>10s} {'GFLOP':>10s} {'TFLOPS':>8s}",
    ]
    for stage, v in r["stages"].items():
        tflops = f"{v['tflops']:.3f}" if v["tflops"] is not None else "-"
        lines.append(f"  {stage:15s} {v['seconds']:10.4f} {v['gflop']:10.2f} {tflops:>8s}")
    lines += [
        f"  {'total (warm)':15s} {r['total_seconds']:10.4f} {r['gflop']:10.2f}",
        f"  cold pass {r['cold_seconds']:.4f} s; warm passes {', '.join(f'{t:.4f}' for t in r['warm_seconds'])} s "
        f"(medians above); nominal {r['nominal_gflop']:.1f} GFLOP (all nocc^2 pairs)",
        f"  peak host memory {r['memory']['peak_rss_mb']:.0f} MB"
        + (f", device {r['memory']['peak_device_mb']:.0f} MB" if "peak_device_mb" in r["memory"] else ""),
    ]
    if r.get("device_gemm_tflops"):
        fraction = r.get("pair_energies_fraction_of_gemm_rate")
        lines.append(f"  device GEMM rate {r['device_gemm_tflops']:.3f} TFLOPS (measured, {r['precision']})"
                     + (f"; pair energies reach {100 * fraction:.0f}% of it" if fraction else ""))
    lines += _model_lines(r, scale=1.0, unit="s")
    click.echo("\n".join(lines))


def _model_lines(r, scale, unit):
    """The calibrated model per target (with its breakdown) and the old peak model."""
    if not r.get("modelled"):
        return []
    lines = ["  MODELLED Trainium time (a model, not a measurement; launch + host transfer + busiest engine):"]
    for target, m in r["modelled"].items():
        parts = ", ".join(f"{k} {v * scale:.3f}" for k, v in m["breakdown"].items() if k != "device")
        own = target == r.get("device")
        lines.append(f"    {target}: {m['seconds'] * scale:.3f} {unit} in {m['launches']} launches "
                     f"({parts} {unit}); Tensor Engine useful fraction "
                     f"{m['tensor_engine_useful_fraction']:.3f}"
                     + ("" if own else f" (from the {r.get('device')} trace)"))
        if m.get("hidden_upload_seconds"):
            lines.append(f"      uploads overlapped with the previous kernel (a runtime assumption, not in "
                         f"host_transfer): {m['hidden_upload_seconds'] * scale:.3f} {unit}")
        if own and m.get("by_kernel"):
            lines.append("      per kernel: " + ", ".join(
                f"{k} useful {v['tensor_engine_useful_fraction']:.2f}, {v['max_instructions_per_launch']:,} "
                f"instructions/launch, SBUF {v['peak_sbuf_bytes_per_partition'] / 1024:.0f} KiB" for k, v in sorted(m["by_kernel"].items())
                if v["tensor_engine_useful_fraction"] is not None))
    lines.append("  peak model (published peaks, no launch cost; old): " + ", ".join(
        f"{k} {v * scale:.3f} {unit}" for k, v in r["modelled_seconds"].items()))
    return lines


def _print_kernel_bench(r):
    m = r["modelled"]
    parts = ", ".join(f"{k} {v * 1e3:.3f}" for k, v in m["breakdown"].items())
    lines = [
        f"dfmp2 bench --kernel {r['kernel']} --size {r['size']}: {r['shape']}, {r['device']}, nki {r['nki_api']}",
        f"  MODELLED warm time (a model, not a measurement): {m['seconds'] * 1e3:.3f} ms in "
        f"{r['launches']} launch(es)",
        f"  breakdown (ms): {parts}",
        "  (launch and host_transfer are serial; the engine times overlap, device = their maximum)",
    ]
    if m.get("tensor_engine_useful_fraction") is not None:
        lines.append(f"  Tensor Engine useful fraction {m['tensor_engine_useful_fraction']:.3f}")
    if "published_trn1_ms" in r:
        lines.append(f"  published trn1 measurement of a sibling library's kernel: {r['published_trn1_ms']} ms "
                     f"(model / measured = {r['model_over_published']:.2f})")
    click.echo("\n".join(lines))


def main(argv=None):
    """Entry point: click's own usage errors also become one line with exit status 2; after a
    signal the process leaves with os._exit(128 + N) once its cleanup has run: through the
    interpreter's own exit, about 1 interrupted run in 8 ended killed by SIGINT after printing
    its message (CPython re-raises a KeyboardInterrupt it once saw unhandled in code run on a
    library's behalf, even one caught since)."""
    try:
        _run_commands(argv)
    except _SignalExit as stop:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(stop.code)


def _run_commands(argv):
    try:
        with command_line_names():  # messages name settings as this command line's options
            cli.main(args=argv, prog_name="dfmp2", standalone_mode=False)
    except click.exceptions.Exit as stop:
        sys.exit(stop.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):  # Ctrl-C outside a command's computation
        _stop("interrupted (SIGINT)", 128 + signal.SIGINT)
    except _Terminated as stop:
        _stop(f"stopped by {signal.Signals(stop.signum).name}", 128 + stop.signum)
    except click.ClickException as error:
        _fail(error.format_message(), 2 if isinstance(error, click.UsageError) else error.exit_code)
    except DFMP2Error:
        raise  # handled (or re-raised under --debug) inside the commands
    sys.exit(0)


if __name__ == "__main__":
    main()
