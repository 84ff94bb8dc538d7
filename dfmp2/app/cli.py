"""Command line: `dfmp2 run`, `grad`, `optimize`, `bench`, `info`. Parses and calls; what a command prints
comes from this layer (`report.py` the summaries, `signals.py` the one-line errors, `progress.py` the status line).

Exit status: 0 success, 2 bad input (one line on stderr), 1 runtime failure (one line).
`--debug` shows the traceback instead.
"""

from __future__ import annotations

import os
import signal
import sys

import click

from ..run.ranks import DEFAULT_TIMEOUT_S
from ..run.settings import Settings
from ..util.errors import DFMP2Error, InputError, command_line_names
from ..util.files import Outputs
from ..util.version import __version__
from .progress import Progress
from .report import print_bench, print_kernel_bench
from .signals import SignalExit, Terminated, fail, guarded, shown, stop_with

DEVICE_CHOICES = "cpu|cuda|trn1|trn2|trn3"
SEED_MAX = 2**64 - 1  # the Philox key is 64 bits


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, invoke_without_command=True)
@click.version_option(__version__, prog_name="dfmp2")
@click.pass_context
def cli(ctx):
    """Density-fitted MP2 (RI-MP2) correlation energies on CPUs, NVIDIA GPUs and Trainium."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


# shared by `run` and `bench`
NKI_API_OPTION = click.option(
    "--nki-api", default=None, metavar="0.2|0.3|0.4|0.5|0.6|0.7",
    help="With --simulate: the NKI release whose rules the emulator applies "
         "[default: the newest AWS documents for the target: 0.2 (Neuron SDK 2.28) on trn1, 0.7 (SDK 2.33) on "
         "trn2 and trn3].")
TRANSFORM_OPTION = click.option(
    "--transform", default=None, metavar="exact|fp32",
    help="trn1/trn2/trn3: the AO->MO transform's arithmetic: exact products of 7-bit slices (1 uEh; the "
         "default) or plain fp32 products (faster; 1e-7 to 1e-3 Eh off on real molecules, see docs/trainium.md).")


@cli.command()
@click.argument("molecules", metavar="MOLECULE.xyz...", nargs=-1, required=True)
@click.option("--basis", default="cc-pvdz", show_default=True,
              help="Orbital basis: any name in PySCF's library or the Basis Set Exchange's data; per element "
                   "'O:aug-cc-pvtz,H:cc-pvdz' (a bare name for the rest); Psi4's cc-pv[tq]z extrapolates to the "
                   "basis-set limit.")
@click.option("--auxbasis", default=None,
              help="MP2 auxiliary basis, a name or per element as --basis [default: the MP2-fit/RI set for --basis].")
@click.option("--jk-auxbasis", default=None,
              help="The density-fitted SCF's fitting set, a name or per element as --basis [default: the JK-fit "
                   "set PySCF pairs with --basis, e.g. def2-universal-jkfit for def2 sets].")
@click.option("--cartesian", is_flag=True, help="Cartesian d, f, ... functions (6d, 10f) instead of spherical ones.")
@click.option("--counterpoise", is_flag=True,
              help="Counterpoise-corrected interaction energy of the fragments (separated by '--' lines in the XYZ "
                   "file): the whole, and each fragment in the whole's basis (same as --bsse cp).")
@click.option("--bsse", default=None, metavar="cp|nocp|cp,nocp",
              help="Interaction energies of the fragments: cp (fragments in the whole's basis), nocp (each in its "
                   "own basis), or both.")
@click.option("--scf-extrapolation", default=None, metavar="highest|exponential",
              help="With a cc-pv[xy]z basis only: the HF energy from the largest basis (as Psi4's "
                   "energy('mp2/cc-pv[xy]z'); the default) or at the basis-set limit by Psi4's exponential formulas "
                   "(scf_xtpl_helgaker_2/3, its scf_basis default); the correlation energy always by Helgaker's X^-3 "
                   "formula on the two largest bases.")
@click.option("--ecp", default="auto", show_default=True, metavar="auto|none|NAME",
              help="Effective core potentials: auto uses those the basis carries (def2: Rb-Rn, as Psi4, ORCA "
                   "and Turbomole do); none runs every atom all-electron; or an ECP library's name.")
@click.option("--charge", type=int, default=None,
              help="Molecular charge [default: the file's 'charge multiplicity' lines, else 0].")
@click.option("--spin", type=int, default=None,
              help="2S (number of unpaired electrons); > 0 runs UHF unless --reference says otherwise [default: "
                   "from the file's 'charge multiplicity' lines (fragments added high-spin), else the lowest: 0, "
                   "or 1 for an odd electron count].")
@click.option("--reference", default=None, metavar="rhf|uhf|rohf",
              help="SCF reference [default: rhf for --spin 0, uhf otherwise]; rohf gives ROHF-MBPT(2) "
                   "on semicanonical orbitals, singles included (as Psi4).")
@click.option("--xc", default=None, metavar="NAME",
              help="Double-hybrid DFT: B2PLYP, B2GPPLYP, DSD-BLYP, DSD-PBEP86, DSD-PBEPBE, PBE0-DH, PBE0-2, "
                   "or a PySCF xc string for the KS part with --c-os/--c-ss. E = E_KS + c_os E_os + c_ss E_ss.")
@click.option("--method", default="mp2", show_default=True, metavar="mp2|sos-mp2",
              help="mp2: canonical DF-MP2 (E(corr, SCS) printed beside it); sos-mp2: scaled opposite-spin MP2, "
                   "E = E_HF + c_os E_os (c_os 1.3, or --c-os), E_os through the Laplace transform (--laplace).")
@click.option("--laplace", default=None, metavar="off|auto|N",
              help="E_os through a Laplace quadrature of 1/Delta, no pair loop (O(N^4)): auto picks the points for "
                   "0.1 uEh per atom (the bound is recorded), N fixes them, off runs the canonical pair loop "
                   "[default: auto with --method sos-mp2 or an opposite-spin-only double hybrid (--c-ss 0), else off].")
@click.option("--c-os", type=float, default=None,
              help="With a custom --xc: the opposite-spin MP2 scaling; with --method sos-mp2: its c_os [1.3].")
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
                   "plus fp32 increments; on trn1/trn2/trn3 exact-product anchors; converges to the fp64 energy) "
                   "or fp64 throughout (cpu, cuda).")
@click.option("--screening", default="auto", show_default=True, metavar="off|auto|THRESHOLD",
              help="Schwarz screening of the three-center integrals (mn|P): only the kept AO-pair blocks are "
                   "computed, stored and transformed (SCF builds and MP2; trn1/trn2/trn3: the MP2 transform only). "
                   "auto: at 1e-10 where it pays (extended molecules); a threshold such as 1e-10: always; off: dense.")
@click.option("--device", default="cpu", show_default=True, metavar=DEVICE_CHOICES,
              help="Where the MP2 kernels (and the SCF's builds) run.")
@click.option("--precision", default=None, metavar="fp32|fp64",
              help="The MP2 step's GEMM precision [default: fp32, within 0.1 uEh of fp64; energy sums "
                   "are fp64]; fp64 (cpu, cuda) keeps every GEMM in fp64. (The tensor-core modes "
                   "tf32x3/bf16x3 are for `dfmp2 bench` only: docs/gpu.md.)")
@click.option("--simulate", is_flag=True,
              help="trn1/trn2/trn3: run the NKI kernels on dfmp2's emulator (target limits enforced).")
@NKI_API_OPTION
@TRANSFORM_OPTION
@click.option("--max-memory", type=float, default=None, metavar="MB",
              help="Memory budget in MB for the whole process; above a hard limit (a cgroup's memory.max/high "
                   "or memsw, RLIMIT_AS/RLIMIT_DATA, Slurm's --mem/--mem-per-cpu/--mem-per-gpu) it is replaced "
                   "by the limits' budget, with a warning [default: what is resident plus 80% of the headroom "
                   "under the tightest of those and free RAM; the JSON's memory.budget_source names it].")
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
@click.option("--json", "json_path", default=None, metavar="PATH",
              help="Write the results as JSON (several molecules: JSON Lines, one record per molecule).")
@click.option("--natorbs", "natorbs_path", default=None, metavar="FILE.molden",
              help="Write the unrelaxed MP2 natural orbitals and occupations (RHF; UHF: of the spin-summed density).")
@click.option("--properties", default=None, metavar="dipole",
              help="Properties from the relaxed MP2 density (Z-vector; RHF and UHF, cpu and cuda): dipole "
                   "(a.u., nuclei included, the input's frame).")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors, and the run's decisions on stderr.")
def run(**options):
    """DF-MP2 energy of the molecule in MOLECULE.xyz (Angstrom); several files, a multi-frame XYZ or a
    directory of *.xyz files run one after another in this process; a QCSchema input.json writes
    its AtomicResult."""
    _run_molecule(options, gradient=False)


def _grad(**options):
    """DF-MP2 energy and analytic nuclear gradient of the molecule in MOLECULE.xyz (Angstrom):
    dE/dR per atom in Eh/bohr, the input's frame and atom order (RHF and UHF references, RKS
    double hybrids). --precision defaults to fp32 as for `run` (the pair stage's GEMMs; its sums and the
    gradient's own GEMMs are fp64): within 5e-9 Eh/bohr of fp64 on cpu (docs/method.md)."""
    _run_molecule(options, gradient=True)


def _optimize(**options):
    """Optimise the geometry of the molecule in MOLECULE.xyz (Angstrom) with geomeTRIC on the
    analytic DF-MP2 gradient (RHF and UHF; PySCF's default convergence criteria). Writes the
    optimised geometry (--output) and every step (--trajectory), one line per step on stderr;
    --checkpoint DIR keeps the finished steps, and the same command resumes from them."""
    _run_molecule(options, gradient=True, optimize=True)


def _run_molecule(options, gradient, optimize=False):
    """`dfmp2 run` (gradient False), `dfmp2 grad` (True) and `dfmp2 optimize`: one code path
    (`jobs.run_molecules`); the options split once into the run's Settings and the job's own
    (`jobs.command_options`)."""
    from .jobs import command_options, run_molecules

    job, settings_options = command_options(options, gradient, optimize)
    run_molecules(job, settings_options)


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


@cli.command()
@click.option("--shape", default=None, metavar="small|medium|large",
              help="A published benchmark shape (nbasis/nocc/naux 128/16/384, 512/64/1536, 768/96/2304).")
@click.option("--nbasis", type=int, default=None, help="Basis functions (instead of --shape).")
@click.option("--nocc", type=int, default=None, help="Occupied orbitals (instead of --shape).")
@click.option("--naux", type=int, default=None, help="Auxiliary functions (instead of --shape).")
@click.option("--seed", type=click.IntRange(0, SEED_MAX), default=0, show_default=True,
              help="Philox seed of the synthetic problem (0 to 2^64 - 1).")
@click.option("--kernel", default=None, metavar="gemm|syrk|trsm|potrf|ao2mo|spmm|pair_energy|rng",
              help="Instead of the pipeline: the MODELLED warm time of one NKI kernel call at --size "
                   "(with --device trn1|trn2|trn3 --simulate).")
@click.option("--size", type=int, default=None, help="With --kernel: the problem size N.")
@click.option("--device", default="cpu", show_default=True, metavar=DEVICE_CHOICES)
@click.option("--simulate", is_flag=True, help="trn1/trn2/trn3: run the NKI kernels on the emulator.")
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
@click.option("--max-memory", type=float, default=None, metavar="MB",
              help="Memory budget in MB for the whole process [default: as dfmp2 run's].")
@click.option("--json", "json_path", default=None, metavar="PATH", help="Write the results as JSON.")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors, and the run's decisions on stderr.")
def bench(shape, nbasis, nocc, naux, seed, kernel, size, repeat, integrals, json_path, quiet, debug, **hardware):
    """Time the DF-MP2 pipeline on a synthetic problem (same seed: same problem on every device),
    or model one NKI kernel call (--kernel)."""
    from .bench import resolve_shape, run_bench, run_kernel_bench
    from .jobs import settings_options

    hardware = settings_options(hardware)  # the options that are Settings fields: device, precision, ...

    def compute():
        if kernel is not None or size is not None:
            if kernel is None or size is None:
                raise InputError("--kernel and --size go together")
            if any(v is not None for v in (shape, nbasis, nocc, naux)) or hardware["model_only"] \
                    or integrals != "host":
                raise InputError("--kernel models one kernel call: no --shape/--nbasis/--nocc/--naux/--model-only/"
                                 "--integrals")
            return run_kernel_bench(kernel, size, hardware["device"], hardware["simulate"], hardware["nki_api"], seed)
        sizes = resolve_shape(shape, nbasis, nocc, naux)
        progress = Progress() if (not quiet and sys.stderr.isatty()) else None
        record = run_bench(*sizes, seed=seed, repeat=repeat, settings=Settings(**hardware), progress=progress,
                           integrals=integrals)
        if progress:
            progress.clear()
        record["shape"]["name"] = shape
        return record

    _record_command(compute, json_path, quiet, debug,
                    lambda record: print_kernel_bench(record) if "kernel" in record else print_bench(record))


def _record_command(compute, json_path, quiet, debug, show):
    """A command whose result is one record (`bench`, `tune`): --json checked first (standard output,
    "-", staged in the scratch root: PYSCF_TMPDIR, TMPDIR), then compute() -> record, written
    whole with --json, the outputs committed; errors one line (`guarded`); show(record) prints the
    summary unless --quiet or --json - ."""
    from ..util.scratch import check_scratch, scratch_root
    from .jobs import write_json

    outputs = Outputs()

    def run():
        if json_path is not None:
            outputs.add("--json", json_path, stdout_ok=True)
            check_scratch()
            outputs.staging = scratch_root()
        record = compute()
        if json_path is not None:
            outputs.write("--json", lambda path: write_json(path, record))
        outputs.commit()
        return record

    record = guarded(run, debug, outputs)
    if not quiet and not outputs.to_stdout():
        shown(lambda: show(record), debug)


@cli.command()
@click.option("--json", "json_path", default=None, metavar="PATH", help="Write what was measured as JSON.")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors, and the run's decisions on stderr.")
def tune(json_path, quiet, debug):
    """Measure again which library runs each kind of CPU product fastest on this machine (every
    shape the cache holds; none yet: a naphthalene/cc-pVTZ run's), and cache the choices."""
    from ..linalg import cpu as cpu_blas
    from ..util.appends import write_stdout
    from ..util.cpu_config import check_environment

    def compute():
        check_environment()  # DFMP2_GEMM
        reason = cpu_blas.cache_unwritable()
        if reason is not None:
            raise InputError(f"dfmp2 tune: the cache directory {reason}: set DFMP2_CACHE_DIR to a writable directory")
        return cpu_blas.tune()

    _record_command(compute, json_path, quiet, debug, lambda record: write_stdout(cpu_blas.describe(record)))


@cli.command()
def info():
    """Versions, and which devices can run on this machine."""
    import platform

    from ..kernels import device_report
    from ..util.appends import write_stdout
    from ..util.files import package_versions

    versions = {"dfmp2": __version__, "python": platform.python_version()}
    for package, version in package_versions(("torch", "pyscf", "numpy", "h5py", "click", "torch-neuronx",
                                              "torch-xla", "neuronx-cc", "nki")).items():
        versions[package] = version or "not installed"
    lines = [f"{name:14s} {version}" for name, version in versions.items()] + ["devices:"]
    lines += [f"  {device:6s} {'usable' if usable else 'unavailable':12s} {detail}"
              for device, (usable, detail) in device_report().items()]
    from ..linalg import cpu as cpu_blas

    lines.append(f"cpu products:  {cpu_blas.summary()}")
    shown(lambda: write_stdout("\n".join(lines)))


def main(argv=None):
    """Entry point: click's own usage errors also become one line with exit status 2; after a
    signal the process leaves with os._exit(128 + N) once its cleanup has run: through the
    interpreter's own exit, about 1 interrupted run in 8 ended killed by SIGINT after printing
    its message (CPython re-raises a KeyboardInterrupt it once saw unhandled in code run on a
    library's behalf, even one caught since)."""
    try:
        _run_commands(argv)
    except SignalExit as stop:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(stop.code)


def _told_the_team(message, argv) -> bool:
    """Launched as one of several ranks, a command line click refused (`--charge x`) is told to the
    other ranks, who would wait at the rendezvous for --rank-timeout else (`ranks.fail_unjoined`,
    joining with the --device and --rank-timeout the words give, if they can be read); True where
    rank 0 reports it for every rank (this process then says nothing more)."""
    from ..run.ranks import DEFAULT_TIMEOUT_S, fail_unjoined

    words = list(sys.argv[1:] if argv is None else argv)

    def value(name, default):
        for k, word in enumerate(words):
            if word == name and k + 1 < len(words):
                return words[k + 1]
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
        return default
    try:
        timeout = float(value("--rank-timeout", DEFAULT_TIMEOUT_S))
        fail_unjoined(InputError(message), value("--device", "cpu").strip().lower(), "--simulate" in words,
                      timeout if timeout > 0 else DEFAULT_TIMEOUT_S)
    except DFMP2Error as told:
        return getattr(told, "reported_by_rank0", False)
    except Exception:  # noqa: BLE001 (a launch that cannot be joined: this rank's own line stands)
        return False
    return False


def _run_commands(argv):
    try:
        with command_line_names():  # messages name settings as this command line's options
            cli.main(args=argv, prog_name="dfmp2", standalone_mode=False)
    except click.exceptions.Exit as stop:
        sys.exit(stop.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):  # Ctrl-C outside a command's computation
        stop_with("interrupted (SIGINT)", 128 + signal.SIGINT)
    except Terminated as stop:
        stop_with(f"stopped by {signal.Signals(stop.signum).name}", 128 + stop.signum)
    except click.ClickException as error:
        code = 2 if isinstance(error, click.UsageError) else error.exit_code
        if isinstance(error, click.UsageError) and _told_the_team(error.format_message(), argv):
            sys.exit(code)  # (rank 0 says it for every rank)
        fail(error.format_message(), code)
    except DFMP2Error:
        raise  # handled (or re-raised under --debug) inside the commands
    sys.exit(0)


if __name__ == "__main__":
    main()
