"""Which library runs each product on a CPU, chosen by measuring the installed ones on this machine
at the run's own shapes, cached per CPU and library versions, recorded with every result.

    matmul(kind, a, b, out=None)   C = A @ B for CPU torch tensors (2-D, or batched as torch.matmul
                                   takes them), on the library chosen for (kind, precision, shape)
    record()                       what ran: per precision the library, its kernels, the measured rate
    remeasure(problems)            measure again, writing the cache (`dfmp2 tune`; solves: kernels.torch.cpu_solves)

Libraries (util.cpu_config.GEMM_LIBRARIES):
    mkl       torch.matmul: torch's BLAS, oneMKL in the pinned wheel (fp32, fp64)
    onednn    torch.ops.mkldnn._linear_pointwise, C = A (B^T)^T: oneDNN's matmul, which picks its
              kernels by the CPU's ISA, not its vendor (fp32 only; oneDNN has no fp64 matmul)
    openblas  numpy.matmul on zero-copy views: numpy's OpenBLAS, its kernels as it detects them or
              as OPENBLAS_CORETYPE pins them (the user's pin is respected and recorded)
Measured on a Zen 5 (AMD EPYC family 26 model 2, 2 threads, OPENBLAS_CORETYPE=Haswell; docs/benchmarking.md):
fp32 mkl ~190 GF/s, openblas ~230, onednn 400-445; fp64 mkl ~100, openblas ~110 (~185 OPENBLAS_* unset).

A choice is made per kind of product (the names the backend passes: "pair", "transform", "half",
"exchange", ...), precision, and shape bucket (each of m, k, n and the batch rounded to a power of
two). The first product of a bucket is measured on its own operands (row-sliced to MEASURE_FLOPS):
each library that computes in its precision runs it once to warm and twice timed, interleaved; a
library whose result differs from torch's beyond the precision's rounding (AGREEMENT) is not taken,
with a note. The fastest is kept, cached as JSON in the user's cache directory (DFMP2_CACHE_DIR,
else $XDG_CACHE_HOME/dfmp2, else ~/.cache/dfmp2) under a name and an identity (util.provenance)
naming the CPU, the library versions, the threads and every variable that pins a library's kernels;
a later run with the same identity measures nothing. A cache that cannot be written: an untuned run
(every product on mkl, torch's default) with a note saying why. DFMP2_GEMM pins a library per
precision (util.cpu_config.gemm_pins): nothing is measured for it. Products below MIN_TUNED_FLOPS,
on a GPU, or of other dtypes run as torch.matmul.

Long (the cache, the choices, the forms and the record share one state and its lock: split, each
part would reach into the others' state).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import threading
from dataclasses import dataclass, field

import torch

from ...util import cpu_config, environment, provenance
from ...util.clock import clock
from ...util.errors import ComputationError, InputError
from ...util.files import write_atomically
from ...util.log import log
from .cpu_libraries import _CALLS, _SOLVES, _available, _takes, kernels, library_versions  # noqa: F401

MEASURE_FLOPS = 2e9  # a measured call's flops at most (rows sliced): ~5-20 ms at 100-400 GF/s
SLOW_WARM = 10.0  # a library whose warm call takes this many times the fastest's is not timed again
MIN_TUNED_FLOPS = 2e7  # below this a product runs on the default library unmeasured (call overheads dominate)
AGREEMENT = {"fp32": 1e-4, "fp64": 1e-11}  # max |C - C_torch| / max |C_torch| a library may differ by
DEFAULT_LIBRARY = "mkl"  # what an untuned run uses: torch's own
CACHE_FORMAT = 4  # 2: the operands' layouts in the key; 3: A A^T apart; 4: the triangular solves
_DTYPES = {torch.float32: "fp32", torch.float64: "fp64"}


# ----------------------------------------------------------------------------- the cache

def cache_directory() -> str:
    """DFMP2_CACHE_DIR, else $XDG_CACHE_HOME/dfmp2, else ~/.cache/dfmp2."""
    given = environment.get("DFMP2_CACHE_DIR")
    if given:
        return given
    base = environment.get("XDG_CACHE_HOME") or os.path.join(environment.get("HOME") or os.path.expanduser("~"),
                                                             ".cache")
    return os.path.join(base, "dfmp2")


def identity() -> dict:
    """What the choices depend on: the CPU (vendor, family, model, stepping, kernel flags), the
    library versions, the threads, and the variables that pin a library's kernels or threads."""
    pins = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
            "MKL_ENABLE_INSTRUCTIONS")
    cpu = cpu_config.cpu_identity()
    return {"format": CACHE_FORMAT, "cpu": {key: cpu[key] for key in ("vendor", "model", "family", "model_number",
                                                                       "stepping", "kernel_flags")},
            "versions": dict(library_versions()), "threads": torch.get_num_threads(),
            "variables": {name: environment.get(name) for name in pins if environment.get(name) is not None}}


def cache_path(held_identity=None) -> str:
    """The cache file of this identity: gemm-<16 hex digits of its digest>.json."""
    return os.path.join(cache_directory(), f"gemm-{provenance.digest(held_identity or identity()).hex()[:16]}.json")


def _writable(directory: str) -> str | None:
    """None where `directory` exists (made here if not) and can be written, else why not."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        return f"{directory} cannot be made ({error.strerror or error})"
    if not os.path.isdir(directory):
        return f"{directory} is not a directory"
    return None if os.access(directory, os.W_OK | os.X_OK) else f"{directory} cannot be written"


# ----------------------------------------------------------------------------- the choices

@dataclass
class Entry:
    """One (kind, precision, bucket)'s choice: the library and each candidate's measured GF/s."""

    library: str
    rates: dict = field(default_factory=dict)
    source: str = "measured"  # "measured" in this process, or read from the "cache"


class _State:
    """The process's choices, loaded on the first product (the cache read once)."""

    def __init__(self):
        self.lock = threading.RLock()
        self.loaded = False
        self.entries = {}  # key -> Entry
        self.used = set()  # the keys whose choice ran a product in this process
        self.defaulted = set()  # the (kind, precision) pairs whose small products' default was logged
        self.flops = {}  # (precision, library) -> flops run in this process
        self.solve_flops = {}  # (precision, library) -> the triangular solves' flops run in this process
        self.notes = []
        self.untuned = None  # why this process runs untuned, or None
        self.pins = {}
        self.identity = None
        self.path = None
        self.measure_seconds = 0.0

    def load(self):
        if self.loaded:
            return
        self.pins = cpu_config.gemm_pins()
        self.identity = identity()
        self.path = cache_path(self.identity)
        reason = _writable(os.path.dirname(self.path))
        if reason is not None and not self.pins:
            self.untuned = (f"CPU products untuned: the cache directory {reason}, so nothing measured could be kept; "
                            f"every product runs on torch's {DEFAULT_LIBRARY} (set DFMP2_CACHE_DIR to a writable "
                            "directory, then `dfmp2 tune`)")
            self.notes.append(self.untuned)
            log.debug("%s", self.untuned)
        if reason is None:
            self.entries.update(_read_cache(self.path, self.identity, self.notes))
        self.loaded = True

    def save(self):
        if self.untuned is not None or self.path is None:
            return
        measured = {key: {"library": e.library, "rates": e.rates} for key, e in self.entries.items()}
        data = json.dumps({"identity": self.identity, "choices": measured}, indent=1, sort_keys=True)

        def write(tmp):
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(data)

        try:
            write_atomically(self.path, write)
        except ComputationError as error:  # a full disk: this run keeps its choices, later ones measure again
            note = f"the GEMM choices were not cached: {error}"
            if note not in self.notes:
                self.notes.append(note)


def _read_cache(path, expected, notes) -> dict:
    """The cached entries at `path` if the file proves it is this identity's (util.provenance), else {}
    with a note (a damaged or foreign file is measured over and replaced)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        why = provenance.mismatch(data.get("identity"), expected)
        if why is not None:
            notes.append(f"the GEMM cache {path} is not this machine's ({why}): measured again")
            return {}
        known = (*_CALLS, *FORMS, *_SOLVES)
        return {key: Entry(value["library"], dict(value["rates"]), "cache") for key, value in data["choices"].items()
                if value.get("library") in known}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        notes.append(f"the GEMM cache {path} could not be read ({type(error).__name__}): measured again")
        return {}


_STATE = _State()


def _bucket(value: int) -> int:
    return 1 << max(0, round(math.log2(max(1, value))))


def _problem(a, b):
    """(batch, m, k, n) of torch.matmul(a, b)."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = max(math.prod(a.shape[:-2]), math.prod(b.shape[:-2]))
    return batch, m, k, n


def _layout(x) -> str:
    """"n" where x's rows have unit stride, "t" where its columns do (a transposed view), else "g"."""
    return "n" if x.stride(-1) == 1 else "t" if x.stride(-2) == 1 else "g"


def key_of(kind: str, precision: str, a, b) -> str:
    """The cache key: kind, precision, the shape bucket and the operands' layouts, e.g.
    "pair/fp32/1024x1024x1024/nt" (B given as a transposed view), "/nts" where B is A^T itself."""
    batch, m, k, n = _problem(a, b)
    shape = f"{_bucket(m)}x{_bucket(k)}x{_bucket(n)}" + (f"x{_bucket(batch)}" if batch > 1 else "")
    return f"{kind}/{precision}/{shape}/{_layout(a)}{_layout(b)}" + ("s" if _gram(a, b) else "")


def _gram(a, b) -> bool:
    """Whether b is a's transpose (the same memory): C = A A^T, which numpy runs as a SYRK (half
    the flops), so it is measured apart from the other products of its shape (layouts "nts")."""
    return a.dim() == 2 and b.dim() == 2 and a.data_ptr() == b.data_ptr() and a.shape == b.shape[::-1] \
        and a.stride() == b.stride()[::-1]


def _sliced(a, b):
    """Operands of the same kind and inner shape with at most MEASURE_FLOPS: rows of a (2-D; of
    both sides of A A^T) or the leading batch (batched), and the flops of that product (2 m k n, as
    though no library used the symmetry)."""
    batch, m, k, n = _problem(a, b)
    flops = 2.0 * batch * m * k * n
    if flops <= MEASURE_FLOPS:
        return a, b, flops
    if batch > 1:
        keep = max(1, int(batch * MEASURE_FLOPS / flops))
        a = a[:keep] if a.dim() > 2 else a
        b = b[:keep] if b.dim() > 2 else b
        return a, b, 2.0 * keep * m * k * n
    if _gram(a, b):  # A A^T stays one: the same rows on both sides
        rows = max(1, int(m * math.sqrt(MEASURE_FLOPS / flops)))
        return a[:rows], a[:rows].transpose(0, 1), 2.0 * rows * k * rows
    rows = max(1, int(m * MEASURE_FLOPS / flops))
    return a[:rows], b, 2.0 * rows * k * n


def _timed_choice(calls: dict, precision: str, flops: float, notes: list, skip_slow: bool = True):
    """calls: name -> call() computing the same product, the first the reference. Each is warmed
    once and timed twice, interleaved (skip_slow: one whose warm call took SLOW_WARM times the
    fastest's is timed on that call alone); the fastest whose result agrees with the reference's
    (AGREEMENT; a note names one that does not) is chosen. -> (Entry, {name: its result})."""
    results, warm, timed = {}, {}, {name: [] for name in calls}

    def run(name):
        begin = clock()
        results[name] = calls[name]()
        return clock() - begin

    for name in calls:
        warm[name] = run(name)
    active = [name for name in calls if not skip_slow or warm[name] <= SLOW_WARM * min(warm.values())]
    for _ in range(2):
        for name in active:
            timed[name].append(run(name))
    first = next(iter(calls))
    reference = results[first].to(torch.float64)
    scale = float(reference.abs().max()) or 1.0
    rates = {}
    for name in calls:
        differs = float((results[name].to(torch.float64) - reference).abs().max()) / scale
        if differs > AGREEMENT[precision]:
            notes.append(f"{name} was not taken for {precision} products: its result differed from {first}'s by "
                         f"{differs:.1e} of the largest element")
            continue
        rates[name] = round(flops / min(timed[name] or [warm[name]]) / 1e9, 1)  # far behind: its warm call
    return Entry(max(rates, key=rates.get), rates, "measured"), results


def _measure(precision, a, b, notes) -> Entry:
    """Each library that takes the product, on (sliced) operands (`_timed_choice`, torch's the reference)."""
    a_m, b_m, flops = _sliced(a, b)
    calls = {lib: (lambda lib=lib: _CALLS[lib](a_m, b_m)) for lib in sorted(_CALLS, key=lambda lib: lib != DEFAULT_LIBRARY)
             if _takes(lib, a, b) and _available(lib) is None}
    return _timed_choice(calls, precision, flops, notes)[0]


def _remember(state, key, measure):
    """entry, results = measure(), kept under `key` with the seconds it took, and cached."""
    start = clock()
    entry, results = measure()
    state.entries[key] = entry
    state.measure_seconds += clock() - start
    state.save()
    return entry, results


def choose(kind: str, a, b, flops: float) -> str:
    """The library for this product: the user's pin, else (small products, an untuned run) the
    default, else the bucket's measured choice (measured now where it has none yet)."""
    precision = _DTYPES[a.dtype]
    state = _STATE
    with state.lock:
        state.load()
        if precision in state.pins:
            library = state.pins[precision]
            missing = _available(library)
            if missing is not None:  # asked for: runs or says why (no silent substitute)
                raise InputError(f"environment variable DFMP2_GEMM pins {library} for {precision} products, "
                                 f"but {missing}: unset it or pin another library")
            return library
        if state.untuned is not None:  # (logged once, in load, where it is decided)
            return DEFAULT_LIBRARY
        if flops < MIN_TUNED_FLOPS:
            if (kind, precision) not in state.defaulted:  # the decision, logged once per kind where it is made
                state.defaulted.add((kind, precision))
                log.debug("CPU product %s/%s below %g flops: %s, not measured", kind, precision, MIN_TUNED_FLOPS,
                          DEFAULT_LIBRARY)
            return DEFAULT_LIBRARY
        key = key_of(kind, precision, a, b)
        entry = state.entries.get(key)
        if entry is None:
            entry, _ = _remember(state, key, lambda: (_measure(precision, a, b, state.notes), None))
        if key not in state.used:  # the decision, logged once where it is made
            log.debug("CPU product %s: %s (%s; GF/s %s)", key, entry.library, entry.source,
                      {name: round(rate) for name, rate in sorted(entry.rates.items())})
        state.used.add(key)
        return entry.library


def matmul(kind: str, a, b, out=None):
    """C = A @ B (torch.matmul's shapes), on the CPU library chosen for (kind, precision, shape);
    a GPU's tensors, other dtypes and small products as torch.matmul."""
    if a.device.type != "cpu" or a.dtype not in _DTYPES or b.dtype != a.dtype or a.requires_grad or b.requires_grad:
        return _mkl(a, b, out)
    batch, m, k, n = _problem(a, b)
    flops = 2.0 * batch * m * k * n
    library = choose(kind, a, b, flops)
    counted = (_DTYPES[a.dtype], library)
    _STATE.flops[counted] = _STATE.flops.get(counted, 0.0) + flops
    return _CALLS[library](a, b, out)


# the formulations a product may take where its operands allow more than one (`fastest_form`):
# the SCF's half transform X^P = F^T B^P (B^P symmetric) batched over P, or stacked as one 2-D
# product (B^P F for every P at once, [nP nao, nao] x [nao, r], then transposed): on oneDNN the
# stacked form ran at 232 GF/s where the batched one ran at 141 on MKL (fp32, naphthalene/cc-pVTZ's
# blocks, Zen 5); fp64 has no such library, and there the batched form is the faster
FORMS = ("batched", "stacked")


def fastest_form(kind: str, a, b, forms: dict):
    """forms: name (of FORMS) -> a call computing the same product of a and b (each through
    `matmul`). The first form where the run is untuned, pinned or the product small; else the
    form measured fastest for (kind, precision, shape bucket) -- each warmed once and timed twice,
    interleaved, checked against the first (`_timed_choice`) -- cached with the libraries'
    choices. -> the product."""
    precision = _DTYPES.get(a.dtype)
    first = next(iter(forms))
    batch, m, k, n = _problem(a, b)
    flops = 2.0 * batch * m * k * n
    if a.device.type != "cpu" or precision is None:
        return forms[first]()
    state = _STATE
    with state.lock:
        state.load()
        if state.pins or state.untuned is not None or flops < MIN_TUNED_FLOPS:
            return forms[first]()
        key = key_of(kind, precision, a, b) + "/forms"
        state.used.add(key)
        entry = state.entries.get(key)
        if entry is not None:
            return forms[entry.library]()
        # (no SLOW_WARM: a form's warm call may include measuring the libraries of its products)
        entry, results = _remember(state, key, lambda: _timed_choice(forms, precision, flops, state.notes,
                                                                     skip_slow=False))
        return results[entry.library]


# ----------------------------------------------------------------------------- the record and tuning

def notes() -> list:
    """What a result announces about the CPU products (untuned, a library not taken, a cache redone)."""
    with _STATE.lock:
        _STATE.load()
        return list(_STATE.notes)


def record() -> dict:
    """cpu_configuration.gemm: per precision the library that ran most of its flops in this process,
    that library's kernels and its measured GF/s (the mean over the buckets it was chosen for), and
    the flops each library ran; the choices that ran here or were measured here (`dfmp2 tune`); the
    cache and whether this process measured, read the cache, ran pinned or untuned."""
    state = _STATE
    with state.lock:
        state.load()
        out = {"cache": None if state.untuned else state.path, "tuned": state.untuned is None,
               "pinned": dict(state.pins), "measure_seconds": round(state.measure_seconds, 3),
               "notes": list(state.notes),
               "choices": {key: {"library": e.library, "rates_gflops": e.rates, "source": e.source}
                           for key, e in sorted(state.entries.items()) if key in state.used or e.source == "measured"}}
        out["solves"] = {}  # the triangular solves' (kernels.torch.cpu_solves), apart from the products'
        for precision, (section, counts, solves) in itertools.product(("fp32", "fp64"), (
                (out, state.flops, False), (out["solves"], state.solve_flops, True))):
            flops = {lib: f for (p, lib), f in counts.items() if p == precision}
            if not flops:
                continue
            library = max(flops, key=flops.get)
            chosen = [e.rates[library] for key, e in state.entries.items() if key in state.used and e.library == library
                      and f"/{precision}/" in key and e.rates.get(library) and key.endswith("/solve") == solves]
            section[precision] = {"library": library, "kernels": kernels(library),
                                  "rate_gflops": round(sum(chosen) / len(chosen), 1) if chosen else None,
                                  "flops_by_library": {lib: float(f) for lib, f in sorted(flops.items())}}
        return out


def remeasure(problems) -> None:
    """Measure each (kind, precision, (batch, m, k, n), layouts) again on random operands of that
    shape and layout (`linalg.cpu.tune`) and rewrite the cache. The forms' choices (`fastest_form`)
    are dropped: their forms are the backend's, and the next run that needs one measures it again."""
    state = _STATE
    with state.lock:
        state.load()
        state.entries = {key: e for key, e in state.entries.items() if not key.endswith("/forms")}
        generator = torch.Generator().manual_seed(0)
        for kind, precision, (batch, m, k, n), layouts in problems:
            dtype = torch.float32 if precision == "fp32" else torch.float64
            a = _operand((batch, m, k) if batch > 1 and kind not in ("half", "transform_half") else (m, k),
                         layouts[0], dtype, generator)
            b = a.transpose(0, 1) if layouts.endswith("s") else \
                _operand((batch, k, n) if batch > 1 else (k, n), layouts[1], dtype, generator)
            _remember(state, key_of(kind, precision, a, b),
                      lambda a=a, b=b, precision=precision: (_measure(precision, a, b, state.notes), None))
        state.save()  # (the forms dropped, where nothing was measured)


def _operand(shape, layout, dtype, generator):
    """Random operand of `shape` in `layout` ("n" row-major, "t" a transposed view, "g" strided)."""
    if layout == "t":
        return torch.randn((*shape[:-2], shape[-1], shape[-2]), generator=generator, dtype=dtype).transpose(-1, -2)
    if layout == "g":
        return torch.randn((*shape[:-1], 2 * shape[-1]), generator=generator, dtype=dtype)[..., ::2]
    return torch.randn(shape, generator=generator, dtype=dtype)


def held_keys() -> list:
    """The keys this process holds a library's choice for (cached or measured; not the forms'; the solves' too)."""
    with _STATE.lock:
        _STATE.load()
        return sorted(key for key in _STATE.entries if not key.endswith("/forms"))


def state_summary() -> dict:
    """{"untuned": why or None, "path", "cached": choices read from the cache, "pins"}."""
    with _STATE.lock:
        _STATE.load()
        return {"untuned": _STATE.untuned, "path": _STATE.path, "pins": dict(_STATE.pins),
                "cached": sum(1 for e in _STATE.entries.values() if e.source == "cache")}


@contextlib.contextmanager
def fresh_state():
    """A new process's choices for the duration (tests: another cache directory, pin or variable)."""
    global _STATE
    saved, _STATE = _STATE, _State()
    try:
        yield _STATE
    finally:
        _STATE = saved
