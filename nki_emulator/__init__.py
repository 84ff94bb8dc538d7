"""An emulator of the NKI API subset dfmp2's kernels use, executed with numpy.

It stands in for the `nki` package (`nki.jit`, `nki.simulate`, `nki.language`, `nki.isa`)
when kernels run with --simulate, and enforces the NeuronCore rules of AWS's NKI ISA
reference for every instruction it models (docs/nki-audit.md: each rule, its AWS source and
the test that proves the refusal): usable SBUF/PSUM capacity of live allocations, partition
and matmul tile limits, one-PSUM-bank matmul and transpose outputs, PSUM tiles of at most one
bank, memories, dtypes and engines per operand (GpSimd never touches PSUM), start-partition
and access-pattern rules, no float64, reductions only over the last free axes, no data
movement across partitions on the engines.

It emulates one NKI API version at a time (`target(name, api=...)`; default: the newest release AWS
documents for the target, 0.2 on trn1, 0.7 on trn2 and trn3) with that release's rules: 0.2 has no
`accumulate=` on nc_matmul and no `engine=`/`priority=` on dma_copy; 0.3+ unrolls every static loop (at
most 5,000,000 instructions per kernel), rejects `*` in a kernel signature, `is`/`is not`, list
arguments, string buffer names and raw ints for enums, and wants a memset value of the tile's dtype; 0.6
adds the device-side `nl.fori_loop` and `nl.while_loop` (and deprecates `nl.dynamic_range`), whose
bodies are traced once: their loop variable is a register (0.7: an `NkiScalar`) Python cannot branch on,
and every iteration must issue the code of the first; 0.7 (Neuron SDK 2.33) removes `nl.dynamic_range`,
inlines nested `@nki.jit` sub-kernels and launches every kernel at neuronx-cc's LNC degree
(`compiler_lnc`; error EVRF066), a plain call at NEURON_LOGICAL_NC_CONFIG's. A release runs only on the
targets AWS documents for it (trn1: 0.2; 0.3, disputed, allowed). No release may DMA out of PSUM (the
stricter reading of 0.2's docs). Indexing takes ints, slices, nl.ds, one Ellipsis and negative indices;
views (reshape, permute, broadcast), placed allocations (`address=`), `dma_transpose`, `affine_select`
and registers are emulated with their rules. nl.bfloat16 tiles hold float32 values rounded to bf16 (RNE)
on every write; nl.float8_e4m3fn tiles (trn3 only: neuronx-cc's EVRF051 on trn1/trn2) likewise hold
float32 values rounded to e4m3fn (RNE, overflow NaN), and nc_matmul takes them (with
perf_mode=double_row too). New on-chip and output memory is NaN-filled and tracked, so reading unwritten
memory or returning a partly written output raises NkiConstraintError. Every call leaves a trace
(matmuls, DMA bytes, vector work) from which a *modelled* trn1/trn2/trn3 time is derived.

What it cannot tell: real timing (the model assumes perfect overlap and no launch cost),
the compiler's own verifier errors, instruction scheduling, or numerical differences of
the hardware's fp32 units beyond IEEE float32 rounding.

A package of its own beside dfmp2, ready to be its own distribution: it imports nothing of dfmp2
(tests/test_architecture_emulator.py) and reads no environment. The Neuron SDK's settings it follows
(SETTINGS: the default target, the LNC degree, dma_transpose as PE transposes) come through the reader
its host installs with `follow_settings` (dfmp2's: dfmp2/kernels/nki/__init__.py, from dfmp2's
util.environment). It keeps the mechanism that counts what a kernel does (the trace, and its uncalibrated
peak model `Trace.modelled_seconds`); the calibrated time model fitted to measurements of dfmp2's
kernels stays with dfmp2 (dfmp2/kernels/nki/model.py).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import textwrap
import threading

import numpy as np

from . import core, isa, language
from .core import (API_VERSIONS, COMPILER_LNC, DISPUTED_API, INSTRUCTION_LIMIT, NEWEST_API, SETTINGS, SUPPORTED_API,
                   TARGETS, NkiConstraintError, Tile, Trace, api_tuple, follow_settings, kernel_run, setting)

__all__ = ["jit", "simulate", "language", "isa", "NkiConstraintError", "TARGETS", "Trace",
           "target", "current_api", "compiler_lnc", "EmulatedKernel", "API_VERSIONS", "NEWEST_API",
           "INSTRUCTION_LIMIT", "SETTINGS", "follow_settings"]


class _Config(threading.local):
    def __init__(self):
        self._target = None  # None: not yet chosen in this thread (NEURON_PLATFORM_TARGET_OVERRIDE's, else trn1)
        self.api = None  # None: the newest release documented for the target
        self.lnc = None  # neuronx-cc's LNC degree (None: NEURON_LOGICAL_NC_CONFIG, else COMPILER_LNC)

    @property
    def target(self) -> str:
        """The emulated target: target()'s, else the host's NEURON_PLATFORM_TARGET_OVERRIDE (read once per
        thread, at its first use), else trn1."""
        if self._target is None:
            name = setting("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
            self._target = {"gen2": "trn1", "inf2": "trn1", "gen3": "trn2"}.get(name, name)
        return self._target

    @target.setter
    def target(self, name: str) -> None:
        self._target = name


_config = _Config()


@contextlib.contextmanager
def target(name: str, api: str | None = None, lnc: int | None = None):
    """Run emulated kernels with the limits of `name` ('trn1', 'trn2' or 'trn3') under the rules of NKI
    API `api` ('0.2' ... '0.7'; None: the newest AWS documents for that target), compiled at
    neuronx-cc's LNC degree `lnc` (None: NEURON_LOGICAL_NC_CONFIG, else the target's default)."""
    if name not in TARGETS:
        raise ValueError(f"unknown NeuronCore target {name!r}")
    if api is not None:
        api_tuple(api)  # ValueError for an unknown version
    if lnc is not None and lnc not in (1, 2):
        raise ValueError(f"LNC degree {lnc!r}: the Neuron SDK supports 1 or 2")
    previous = (_config.target, _config.api, _config.lnc)
    _config.target, _config.api, _config.lnc = name, api, lnc
    try:
        yield TARGETS[name]
    finally:
        _config.target, _config.api, _config.lnc = previous


def _environment_lnc() -> int | None:
    """NEURON_LOGICAL_NC_CONFIG as an int (None where unset)."""
    given = setting("NEURON_LOGICAL_NC_CONFIG")
    if given is None:
        return None
    if given.strip() not in ("1", "2"):
        raise NkiConstraintError(f"NEURON_LOGICAL_NC_CONFIG={given!r}: the Neuron SDK supports LNC 1 or 2")
    return int(given)


def compiler_lnc() -> int:
    """neuronx-cc's LNC degree for the emulated target: target(lnc=), else the environment's
    NEURON_LOGICAL_NC_CONFIG (AWS's setting for kernel and compiler alike), else COMPILER_LNC."""
    if _config.lnc is not None:
        return _config.lnc
    given = _environment_lnc()
    return COMPILER_LNC[_config.target] if given is None else given


def current_api() -> str:
    """The NKI API version emulated now."""
    return _config.api or NEWEST_API[_config.target]


class EmulatedKernel:
    """A kernel function run on the emulator: numpy arrays in, numpy arrays out."""

    def __init__(self, fn):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.last_trace = None

    def __getitem__(self, grid):
        """`kernel[n](...)`: launch on a logical NeuronCore of n physical cores (SPMD grid of n
        programs, `nl.program_id(0)` = 0..n-1). n = 2 needs trn2 or trn3 (LNC=2); trn1 has LNC=1 only."""
        if not isinstance(grid, int) or isinstance(grid, bool) or grid < 1:
            raise NkiConstraintError(f"launch grid must be one positive int (cores), got {grid!r}")
        limit = TARGETS[_config.target].max_lnc
        if grid > limit:
            raise NkiConstraintError(
                f"{self.fn.__name__}[{grid}]: {_config.target} runs at most LNC={limit} physical "
                f"core(s) per launch (trn1: LNC=1 only; trn2, trn3: LNC=1 or 2)" + _row("L13"))
        return functools.partial(self._launch, grid)

    def __call__(self, *args):
        """A plain call: under nki 0.7 at the degree NEURON_LOGICAL_NC_CONFIG sets (1 when unset; the 0.7
        nki.jit page), before 0.7 on one core."""
        if core.running():
            return self._inline(*args)
        api = current_api()
        return self._launch(_environment_lnc() or 1 if api_tuple(api) >= (0, 7) else 1, *args)

    def _inline(self, *args):
        """A jitted kernel called from a running kernel (rule L20): nki 0.7 inlines a nested @nki.jit
        sub-kernel (SpecializationConfig.allow_nested_config_override); 0.2-0.6 refuse it (the 0.2
        migration guide: remove nki.jit from sub-kernels)."""
        run = core.current_run(check=False)
        if not run.api_at_least("0.7"):
            raise NkiConstraintError(
                f"{self.fn.__name__} is decorated with nki.jit and called from the kernel {run.name}: under nki "
                f"{run.api} a sub-kernel must not be decorated (remove nki.jit from it, or apply it at the top "
                f"call site) [L20; {run.target.name}, nki {run.api}]")
        return self.fn(*args)

    def _launch(self, programs, *args):
        """Run the kernel's programs one after another (each with its own on-chip memory, as on
        its own physical core); shared_hbm outputs are common to all of them."""
        api = current_api()
        if core.running():
            run = core.current_run(check=False)
            raise NkiConstraintError(f"{self.fn.__name__}[{programs}] called from the kernel {run.name}: a kernel "
                                     f"with a launch grid cannot be called from another kernel "
                                     f"[L20; {run.target.name}, nki {run.api}]")
        if api not in SUPPORTED_API[_config.target] and api not in DISPUTED_API.get(_config.target, ()):
            raise NkiConstraintError(
                f"{self.fn.__name__}: nki {api} does not support {_config.target} (AWS documents nki 0.3+ for "
                f"Trainium2 and Trainium3 only, and SDK 2.28's nki 0.2 does not list Trainium3; {_config.target} "
                f"runs nki {', '.join(SUPPORTED_API[_config.target])}) [L19; {_config.target}, nki {api}]")
        if api_tuple(api) >= (0, 7) and programs != compiler_lnc():  # rule L14 (compiler error EVRF066)
            raise NkiConstraintError(
                f"NKI kernel '{self.fn.__name__}' is configured with LNC={programs}, but neuronx-cc is using "
                f"LNC={compiler_lnc()}. (EVRF066: every kernel of a model at the compiler's LNC degree; set "
                f"NEURON_LOGICAL_NC_CONFIG) [L14; {_config.target}, nki {api}]")
        if api == "0.6" and _environment_lnc() not in (None, programs):  # rule L21
            raise NkiConstraintError(
                f"{self.fn.__name__} launched at LNC={programs} with NEURON_LOGICAL_NC_CONFIG={_environment_lnc()}: the "
                f"kernel's LNC value (a plain call: 1; kernel[n]: n) must match the variable (nki.jit, nki 0.6: a "
                f"mismatch is a runtime error) [L21; {_config.target}, nki {api}]")
        if api_tuple(api) >= (0, 3):
            _check_python_subset(self.fn, api)
            if any(isinstance(arg, list) for arg in args):
                raise NkiConstraintError(
                    f"{self.fn.__name__}: nki {api} accepts no list kernel argument (0.2 did): pass a tuple "
                    f"[L9; {_config.target}, nki {api}]")
        hbm_args = [_as_hbm(arg, self.fn.__name__, n) for n, arg in enumerate(args)]
        shared, traces, loops, result = [], [], [], None
        with _one_blas_thread():
            for pid in range(programs):
                with kernel_run(TARGETS[_config.target], self.fn.__name__, api, pid, programs,
                                shared) as run:
                    result = self.fn(*hbm_args)
                    run.checkpoint()
                traces.append(run.trace)
                loops.append(run.dynamic_loops)
        if any(other != loops[0] for other in loops[1:]):  # rule L22
            ran = "; ".join(f"program {n}: " + (", ".join(f"{name} x{trips}" for name, trips in each) or "none")
                            for n, each in enumerate(loops))
            raise NkiConstraintError(
                f"{self.fn.__name__}: the programs of one launch ran different device loops ({ran}): dynamic "
                "control flow that differs between the cores of a logical NeuronCore is undefined behaviour "
                f"(AWS's LNC guide) [L22; {_config.target}, nki {api}]")
        outputs = result if isinstance(result, tuple) else (result,)
        arrays = tuple(_returned(tile, self.fn.__name__) for tile in outputs)
        trace = traces[0]
        if programs > 1:
            trace = Trace()
            for part in traces:
                trace.add(part)
            trace.programs = traces
        trace.launches = 1
        trace.host_bytes_in = sum(a.nbytes for a in args if isinstance(a, np.ndarray))
        trace.host_bytes_out = sum(a.nbytes for a in arrays)
        self.last_trace = trace
        return arrays if isinstance(result, tuple) else arrays[0]


def jit(fn=None, **kwargs):
    """`@nki.jit`: on the emulator, a kernel called with numpy arrays runs eagerly."""
    if fn is None:
        return lambda f: EmulatedKernel(f)
    return EmulatedKernel(fn)


def simulate(kernel):
    """`nki.simulate(kernel)(*arrays)`: run a kernel (jitted or not) on the emulator."""
    return kernel if isinstance(kernel, EmulatedKernel) else EmulatedKernel(kernel)


@functools.lru_cache(maxsize=None)
def _blas_controller():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _one_blas_thread():
    """Kernels issue thousands of 128 x 512 matmuls: waking a BLAS thread pool for each costs
    more than the product (measured 14x slower on 2 cores), so they run on one thread."""
    return _blas_controller().limit(limits=1, user_api="blas")


@functools.lru_cache(maxsize=None)
def _python_subset_violation(fn):
    """The first construct of `fn`'s source that nki 0.3+ rejects, or None."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None  # no source (e.g. built interactively): nothing to check
    tree = ast.parse(source)
    function = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef))
    args = function.args
    if args.vararg or args.kwarg or args.kwonlyargs:
        return "'*' or '**' in the kernel signature"
    if any(isinstance(default, ast.List) for default in args.defaults + args.kw_defaults):
        return "a list default in the kernel signature (use a tuple)"
    for node in ast.walk(function):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
            return f"'is' / 'is not' (line {function.lineno + node.lineno - 1} of the kernel)"
    return None


def _check_python_subset(fn, api):
    problem = _python_subset_violation(fn)
    if problem:
        raise NkiConstraintError(
            f"{fn.__name__}: nki {api} rejects {problem}; the 0.3+ kernel language has no varargs, "
            "keyword-only arguments, list arguments or identity comparisons (use == / !=) "
            f"[L8/L9; {_config.target}, nki {api}]")


def _as_hbm(arg, kernel_name, position):
    if isinstance(arg, np.ndarray):
        if arg.dtype == np.float64:
            raise NkiConstraintError(
                f"{kernel_name}: argument {position} is float64 {arg.shape}; there is no float64 on "
                "a NeuronCore (convert to float32 on the host)")
        if arg.dtype not in language.DTYPES:
            raise NkiConstraintError(
                f"{kernel_name}: argument {position} is {arg.dtype} {arg.shape}, not an NKI dtype" + _row("X13"))
        data = np.ascontiguousarray(arg)
        ones = np.ones(data.shape, dtype=bool)
        return Tile(data, ones, np.zeros(data.shape, dtype=bool), language.shared_hbm)
    return arg  # compile-time constants: ints, floats, tuples


def _row(rule: str) -> str:
    """A launch-level refusal's suffix: its row of docs/nki-audit.md, the target and the release."""
    return f" [{rule}; {_config.target}, nki {current_api()}]"


def _returned(tile, kernel_name) -> np.ndarray:
    if not isinstance(tile, Tile) or tile.buffer != "shared_hbm":
        raise NkiConstraintError(f"{kernel_name}: kernel outputs must be nl.shared_hbm tensors (0.3+; the "
                                 "emulator applies it to 0.2 too)" + _row("L7"))
    if not tile.written.all():
        missing = int((~tile.written).sum())
        raise NkiConstraintError(
            f"{kernel_name}: output {tile.shape} has {missing} element(s) no instruction wrote" + _row("X14"))
    return np.array(tile.data, copy=True)
