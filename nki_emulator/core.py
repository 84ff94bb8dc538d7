"""Execution state of the NKI emulator: targets and their limits, NKI API versions, tiles,
live-allocation accounting, the instruction trace, its peak timing model and the host's Neuron settings.

Long (the state every emulated instruction shares, in one place: the dtypes numpy lacks, bf16 and
fp8, the three targets, the releases, tiles, the kernel run and its trace).

Tiles are numpy arrays with a buffer kind (hbm, sbuf, psum). The first axis of an on-chip
tile is the partition axis. New on-chip allocations are filled with NaN, so reading memory
that no instruction wrote poisons the result.

The Neuron settings (SETTINGS: on a Neuron host the SDK takes them from its process's environment) reach
the emulator through the reader its host installs (`follow_settings`), asked each time one is used; the
emulator itself reads no environment, and without a reader every setting takes its default.
"""

from __future__ import annotations

import contextlib
import math
import operator
import threading
import weakref
from collections import Counter
from dataclasses import dataclass, field

import numpy as np



# the host's Neuron SDK settings the emulator follows, by the environment variable that carries each:
# its default target (gen2/inf2 = trn1, gen3 = trn2), neuronx-cc's and the kernels' LNC degree, and
# dma_transpose lowered to PE transposes ("true": PSUM bank 7 reserved for nc_transpose)
SETTINGS = ("NEURON_PLATFORM_TARGET_OVERRIDE", "NEURON_LOGICAL_NC_CONFIG", "NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE")
_settings_reader = None  # reader(name) -> str, or None where unset; None: no reader, every setting unset


def follow_settings(reader) -> None:
    """Read the settings of SETTINGS through `reader(name, default)` (the value as a str, else `default`)
    from now on, each time one is used; None: no reader (every setting unset)."""
    global _settings_reader
    _settings_reader = reader


def setting(name: str, default=None):
    """The host's value of setting `name` (one of SETTINGS) as a str, or `default` where it is unset."""
    if name not in SETTINGS:
        raise KeyError(f"{name} is not a Neuron setting the emulator follows (SETTINGS: {', '.join(SETTINGS)})")
    return default if _settings_reader is None else _settings_reader(name, default)


class NkiConstraintError(RuntimeError):
    """A kernel broke a NeuronCore rule (names the instruction, the tile shape and the limit)."""


class BFloat16:
    """The dtype `nl.bfloat16` (1 sign, 8 exponent, 7 mantissa bits). numpy has no bfloat16, so a
    bf16 tile keeps its values in a float32 array (`storage`) and every write into it is rounded
    to bf16, round-to-nearest-even (AWS's "Neuron Rounding Modes": RNE is the default of every
    NeuronCore). It counts 2 bytes per element (SBUF capacity, DMA bytes)."""

    name = "bfloat16"
    kind = "f"
    itemsize = 2
    storage = np.dtype(np.float32)

    def __repr__(self):
        return "bfloat16"

    __str__ = __repr__

    def __reduce__(self):
        return "BFLOAT16"


BFLOAT16 = BFloat16()


def round_to_bf16(value: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16, ties to even (NaN stays NaN, overflow
    goes to +-inf), returned as float32."""
    bits = np.ascontiguousarray(value, dtype=np.float32).view(np.uint32)
    rounded = (bits + (((bits >> 16) & 1) + np.uint32(0x7FFF))) & np.uint32(0xFFFF0000)
    out = rounded.view(np.float32)
    nan = np.isnan(value)
    if nan.any():
        out = np.where(nan, np.float32(np.nan), out)
    return out


class Float8E4M3FN:
    """The dtype `nl.float8_e4m3fn` (OCP FP8 E4M3FN: 1 sign, 4 exponent bits of bias 7, 3 mantissa
    bits; no infinity, NaN = S.1111.111, largest finite +-448, smallest subnormal 2^-9). Native on
    NeuronCore-v4 (trn3) only: neuronx-cc refuses it on trn1/trn2 (error EVRF051), so the emulator
    allows it on targets in FP8_E4M3FN_TARGETS only (rule L16). Like BFloat16, an fp8 tile keeps
    its values in a float32 array and every write rounds (`round_to_fp8_e4m3fn`); 1 byte per
    element. Every integer of magnitude <= 16 is exact (4 significant bits)."""

    name = "float8_e4m3fn"
    kind = "f"
    itemsize = 1
    storage = np.dtype(np.float32)
    max_finite = 448.0

    def __repr__(self):
        return "float8_e4m3fn"

    __str__ = __repr__

    def __reduce__(self):
        return "FLOAT8_E4M3FN"


FLOAT8_E4M3FN = Float8E4M3FN()
FP8_E4M3FN_TARGETS = ("trn3",)  # NeuronCore-v4 and later (EVRF051: not on TRN1/TRN2)


def round_to_fp8_e4m3fn(value: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest float8_e4m3fn value, ties to even, returned as float32.

    Overflow (a value that rounds above 448, i.e. |x| > 464; +-inf) and NaN give NaN: the OCP
    format has no infinity and the emulator takes the non-saturating conversion of the OCP spec
    (the stricter choice: an overflowing kernel is poisoned, not silently clamped to 448; AWS does
    not document which one the NeuronCore uses; torch's cast saturates instead). Subnormals
    (multiples of 2^-9 below 2^-6) are kept; the sign of zero is kept.
    """
    x = np.asarray(value, dtype=np.float32).astype(np.float64)
    size = np.abs(x)
    finite = np.isfinite(size)
    _, exp2 = np.frexp(np.where(finite & (size > 0), size, 1.0))  # size = f 2^exp2, f in [0.5, 1)
    quantum = np.exp2(np.maximum(exp2 - 1, -6) - 3)  # 3 mantissa bits; subnormal grid 2^-9
    rounded = np.rint(np.where(finite, size, 0.0) / quantum) * quantum  # exact scaling; rint is RNE
    out = np.copysign(rounded, x)
    out = np.where(finite & (rounded <= Float8E4M3FN.max_finite), out, np.nan)
    return out.astype(np.float32)


# ---- NKI API versions ---------------------------------------------------------------------
# nki 0.2 = Neuron SDK 2.28 (the last release whose docs list trn1); 0.3-0.6 = SDK 2.29-2.32 (trn3 is
# listed from SDK 2.29 / nki 0.3 on: AWS's release manifest);
# 0.7 = SDK 2.33 (released 2026-10-19; its new rules: docs/nki-audit.md, L11, L14, L15).
API_VERSIONS = ("0.2", "0.3", "0.4", "0.5", "0.6", "0.7")
# newest release AWS documents for each target, that dfmp2 runs
NEWEST_API = {"trn1": "0.2", "trn2": "0.7", "trn3": "0.7"}
# the releases AWS documents for each target (rule L19): the NKI FAQ of SDK 2.29-2.33 ("NKI supports
# Trainium2 and Trainium3"), the NxD Inference 2.29 notes ("NKI 0.3.0 kernels are not supported on Trn1/Inf2");
# trn1 stays on SDK 2.28 (nki 0.2); SDK 2.28 does not list Trn3
SUPPORTED_API = {"trn1": ("0.2",), "trn2": API_VERSIONS, "trn3": API_VERSIONS[1:]}
# a pair AWS refuses that a sibling library ran (nki 0.3.0 on trn1, neuronx-cc 2.24): emulated, and announced
DISPUTED_API = {"trn1": ("0.3",)}
# neuronx-cc's logical NeuronCore degree unless NEURON_LOGICAL_NC_CONFIG says otherwise: "neuronx-cc
# defaults to LNC=2 on Trn2 and later" (AWS, compiler error code EVRF066, Neuron 2.33 documentation)
COMPILER_LNC = {"trn1": 1, "trn2": 2, "trn3": 2}
INSTRUCTION_LIMIT = 5_000_000  # unrolled instructions per kernel under 0.3+ (error XTP002)


def api_tuple(version: str) -> tuple:
    """'0.3' -> (0, 3); raises ValueError for a version the emulator does not know."""
    if version not in API_VERSIONS:
        raise ValueError(f"unknown NKI API version {version!r} (emulated: {', '.join(API_VERSIONS)})")
    return tuple(int(x) for x in version.split("."))


@dataclass(frozen=True)
class Target:
    """Per-NeuronCore limits and published peaks (trn1 = NeuronCore-v2, trn2 = NeuronCore-v3,
    trn3 = NeuronCore-v4; sources: docs/hardware-facts.md).

    SBUF: the physical bytes per partition, and the part of it the compiler keeps for itself.
    AWS documents the usable size only as "total minus reserved bytes"
    (nl.tile_size.total_available_sbuf_size on a host); the emulator reserves 16 KiB per
    partition, an assumption that keeps kernels clear of the physical limit.
    """

    name: str
    sbuf_bytes_per_partition: int
    sbuf_reserved_bytes_per_partition: int = 16 * 1024
    psum_bytes_per_partition: int = 16 * 1024
    psum_bank_bytes: int = 2 * 1024
    partitions: int = 128
    stationary_free_max: int = 128
    moving_free_max: int = 512
    fp32_tflops: float = 0.0  # Tensor Engine, per core
    bf16_tflops: float = 0.0
    hbm_gb_per_s_per_core: float = 0.0  # chip bandwidth / cores per chip
    cores_per_chip: int = 1
    max_lnc: int = 1  # physical cores one kernel launch may span (logical NeuronCore degree)
    vector_gelem_per_s: float = 0.0  # modelled elementwise throughput (elements / ns)

    @property
    def sbuf_usable_bytes_per_partition(self) -> int:
        return self.sbuf_bytes_per_partition - self.sbuf_reserved_bytes_per_partition


TARGETS = {
    # HBM: 820 GB/s per trn1 chip (2 cores), 2.9 TB/s per trn2 chip (8 cores), 4.9 TB/s per trn3 chip
    # (8 cores; AWS's Trainium3 page; its NKI Trainium3 guide says 4.7). vector_gelem_per_s: MODEL,
    # one element per partition per engine cycle (trn3: at the documented 1.2 GHz).
    "trn1": Target("trn1", sbuf_bytes_per_partition=192 * 1024, fp32_tflops=23.0, bf16_tflops=92.0,
                   hbm_gb_per_s_per_core=820.0 / 2, cores_per_chip=2, vector_gelem_per_s=128 * 1.4),
    "trn2": Target("trn2", sbuf_bytes_per_partition=224 * 1024, fp32_tflops=20.0, bf16_tflops=79.0,
                   hbm_gb_per_s_per_core=2900.0 / 8, cores_per_chip=8, max_lnc=2,
                   vector_gelem_per_s=128 * 1.4),
    # NeuronCore-v4: 32 MiB SBUF (256 KiB per partition), 2 MiB PSUM (16 KiB per partition, 8 banks),
    # Tensor Engine 79 bf16 / 20 fp32 TFLOPS per core (the per-core figures, which agree with the
    # 2.4 GHz clock; AWS's per-chip 671 / 183 are not 8 x those, docs/hardware-facts.md). nc_matmul on
    # v4 documents a moving free size up to 4096 (fp32 dst); the emulator keeps 512, one PSUM bank
    # per matmul output (rule MM9, the stricter reading: Tile-Size Constraint #2 keeps PSUM tiles at
    # one bank on every target).
    "trn3": Target("trn3", sbuf_bytes_per_partition=256 * 1024, fp32_tflops=20.0, bf16_tflops=79.0,
                   hbm_gb_per_s_per_core=4900.0 / 8, cores_per_chip=8, max_lnc=2,
                   vector_gelem_per_s=128 * 1.2),
}


@dataclass
class Trace:
    """What one kernel call did: Tensor Engine matmuls, DMA bytes, vector/scalar work."""

    matmuls: int = 0
    matmul_flops: int = 0
    matmul_shapes: Counter = field(default_factory=Counter)  # (K, M, N) -> count
    dma_bytes_in: int = 0  # HBM -> on-chip
    dma_bytes_out: int = 0  # on-chip -> HBM
    vector_ops: int = 0
    vector_elements: int = 0
    peak_sbuf_bytes: int = 0  # per partition
    peak_psum_bytes: int = 0
    instructions: Counter = field(default_factory=Counter)  # engine -> instructions issued
    engine_elements: Counter = field(default_factory=Counter)  # engine -> elements processed
    matmul_columns: int = 0  # moving-tensor columns streamed through the Tensor Engine
    # the same columns by the moving operand's dtype name ('float32', 'bfloat16', 'float16'):
    # the Tensor Engine streams fp32 at a quarter of the bf16/fp16 rate (its host's model: dfmp2/kernels/nki/model.py)
    matmul_columns_by_dtype: Counter = field(default_factory=Counter)
    dma_transfers: int = 0  # dma_copy instructions
    launches: int = 0  # kernel calls
    host_bytes_in: int = 0  # kernel arguments (host -> device HBM)
    host_bytes_out: int = 0  # kernel results (device HBM -> host)
    # a launch on a logical NeuronCore of several physical cores (SPMD grid): one trace per
    # program, each on its own core (the sums above cover all of them); empty for one program
    programs: list = field(default_factory=list)

    def add(self, other: "Trace") -> None:
        self.matmuls += other.matmuls
        self.matmul_flops += other.matmul_flops
        self.matmul_shapes.update(other.matmul_shapes)
        self.dma_bytes_in += other.dma_bytes_in
        self.dma_bytes_out += other.dma_bytes_out
        self.vector_ops += other.vector_ops
        self.vector_elements += other.vector_elements
        self.peak_sbuf_bytes = max(self.peak_sbuf_bytes, other.peak_sbuf_bytes)
        self.peak_psum_bytes = max(self.peak_psum_bytes, other.peak_psum_bytes)
        self.instructions.update(other.instructions)
        self.engine_elements.update(other.engine_elements)
        self.matmul_columns += other.matmul_columns
        self.matmul_columns_by_dtype.update(other.matmul_columns_by_dtype)
        self.dma_transfers += other.dma_transfers
        self.launches += other.launches
        self.host_bytes_in += other.host_bytes_in
        self.host_bytes_out += other.host_bytes_out

    def modelled_seconds(self, target: Target) -> float:
        """PEAK MODEL (uncalibrated), not a measurement: max of Tensor Engine (fp32 peak), DMA (HBM
        share of one core) and vector-engine time, assuming perfect overlap and no launch
        overhead. A calibrated model belongs to the emulator's host (dfmp2's: kernels/nki/model.py)."""
        tensor = self.matmul_flops / (target.fp32_tflops * 1e12)
        dma = (self.dma_bytes_in + self.dma_bytes_out) / (target.hbm_gb_per_s_per_core * 1e9)
        vector = self.vector_elements / (target.vector_gelem_per_s * 1e9)
        return max(tensor, dma, vector)

    def as_dict(self) -> dict:
        return {"matmuls": self.matmuls, "matmul_gflop": self.matmul_flops / 1e9,
                "dma_mb_in": self.dma_bytes_in / 1e6, "dma_mb_out": self.dma_bytes_out / 1e6,
                "vector_ops": self.vector_ops, "vector_elements": self.vector_elements,
                "peak_sbuf_bytes_per_partition": self.peak_sbuf_bytes,
                "peak_psum_bytes_per_partition": self.peak_psum_bytes,
                "instructions": dict(self.instructions), "dma_transfers": self.dma_transfers,
                "launches": self.launches, "host_mb_in": self.host_bytes_in / 1e6,
                "host_mb_out": self.host_bytes_out / 1e6}


class _State(threading.local):
    def __init__(self):
        self.run = None


_state = _State()


class KernelRun:
    """One emulated kernel invocation: the target, live on-chip bytes, the trace.

    Capacity is checked at every instruction, allocation and the kernel's end (checkpoints),
    not inside the allocation itself: in `t = nl.ndarray(...)` inside a loop, the tile that
    `t` held is released as soon as the assignment completes, as the compiler would reuse
    its buffer; tiles that are still referenced (kept in a list, bound to other names) count.
    """

    def __init__(self, target: Target, name: str, api: str, program_id: int = 0, programs: int = 1,
                 shared_outputs=None):
        self.target = target
        self.name = name
        self.api = api
        self.program_id = program_id  # SPMD grid: this program's index (its physical core)
        self.programs = programs
        # nl.shared_hbm tensors a kernel allocates are shared by all programs of a launch: the
        # n-th allocation of every program is the same tensor
        self.shared_outputs = shared_outputs if shared_outputs is not None else []
        self._shared_allocations = 0
        self.api_version = api_tuple(api)
        self.trace = Trace()
        self.unrolled = 0  # instructions in the compiled kernel (device-side loop bodies once)
        self._device_loop_repeats = 0  # > 0 inside a later iteration of a device-side loop
        self._loop_scopes = []  # per open nl.fori_loop body: weak references to its allocations
        self.live = {"sbuf": 0, "psum": 0}  # bytes per partition
        self._last = {"sbuf": None, "psum": None}  # description of the latest allocation
        self._allocated_since_check = False  # releases only lower the live bytes: nothing to check
        # the Scalar Engine's reduce registers (one fp32 per partition, nisa.activation reduce_cmd);
        # None until an instruction resets them (reading them before is refused)
        self.scalar_reduce_regs = None
        self._serial = 0  # allocations made so far (a tile's `serial`: which allocation it is)
        self._traced_loops = []  # open device loops whose body is traced once (nl.fori_loop, nl.while_loop)
        self.no_reorder = 0  # depth of open nl.no_reorder() blocks
        self.dynamic_loops = []  # (loop, trip count) of each device loop this program ran (rule L22)

    def allocate(self, buffer: str, per_partition: int, shape, owner) -> None:
        if buffer == "psum":  # PSUM is handed out in whole 2 KiB banks
            bank = self.target.psum_bank_bytes
            per_partition = -(-per_partition // bank) * bank
        self.live[buffer] += per_partition
        self._allocated_since_check = True
        self._last[buffer] = (tuple(shape), per_partition)
        weakref.finalize(owner, self._release, buffer, per_partition)

    def number(self, tile) -> None:
        """Give a new allocation its serial number (its identity in a traced loop body)."""
        tile.serial = self._serial
        self._serial += 1

    @contextlib.contextmanager
    def traced_loop(self, what: str):
        """A device-side loop whose body the compiler sees once (nki 0.6+: nl.fori_loop, nl.while_loop).
        The emulator runs the body once per iteration; `traced_iteration` checks that each iteration
        issues what the first did (rule L17): a body that keeps state in Python across iterations (a
        counter, a list it appends to, a branch on a Python value that changes) compiles to the
        first iteration's code on the device, and computes something else there."""
        code = self._traced_loops[-1].code_of_nested_loop() if self._traced_loops else _LoopCode()
        self._traced_loops.append(_TracedLoop(what, code))
        try:
            yield self._traced_loops[-1]
        finally:
            self._traced_loops.pop()

    @contextlib.contextmanager
    def traced_iteration(self, loop: "_TracedLoop"):
        loop.begin(self._serial)
        with self.device_loop_iteration(first=loop.recording):
            yield
        loop.end(self)

    def record(self, name: str, args: tuple) -> None:
        """An instruction or allocation (or a nested device loop) inside an open traced loop: appended to
        the innermost loop's body code the first time that body runs, compared with it every later time.
        A nested loop's body is code of its own, traced once whichever iteration of the outer loop first
        runs it (`_LoopCode`); tiles are named by the innermost open iteration they were allocated in."""
        if self._traced_loops:
            starts = [loop.start_serial for loop in self._traced_loops]
            self._traced_loops[-1].record((name,) + tuple(_canonical(arg, starts) for arg in args), self)

    def api_at_least(self, version: str) -> bool:
        return self.api_version >= api_tuple(version)

    def issue(self, engine: str, elements: int = 0) -> None:
        """Count one instruction on `engine` ('tensor', 'vector', 'scalar', 'gpsimd', 'dma').

        The trace counts every executed instruction; `unrolled` counts the compiled program,
        in which a device-side loop body appears once. Under nki 0.3+ every static loop is
        unrolled at trace time and a kernel over INSTRUCTION_LIMIT instructions fails to compile.
        """
        self.trace.instructions[engine] += 1
        self.trace.engine_elements[engine] += int(elements)
        if self._device_loop_repeats:
            return
        self.unrolled += 1
        if self.unrolled > INSTRUCTION_LIMIT and self.api_at_least("0.3"):
            raise NkiConstraintError(
                f"{self.name}: more than {INSTRUCTION_LIMIT:,} instructions after unrolling (nki "
                f"{self.api} unrolls every static loop at trace time; the compiler stops with "
                f"XTP002): use a device-side loop or launch smaller blocks [L12; {self.target.name}, nki {self.api}]")

    @contextlib.contextmanager
    def loop_scope(self):
        """The body of an nl.fori_loop: tensors allocated inside it are closed when it ends (AWS:
        "Tensors declared inside a body function cannot be referenced outside of the loop")."""
        self._loop_scopes.append([])
        try:
            yield
        finally:
            for ref in self._loop_scopes.pop():
                tile = ref()
                if tile is not None:
                    tile.scope_closed = True

    def scoped(self, tile) -> None:
        """Record an on-chip allocation made inside an open loop body (weakly: it still frees)."""
        if self._loop_scopes:
            self._loop_scopes[-1].append(weakref.ref(tile))

    @contextlib.contextmanager
    def device_loop_iteration(self, first: bool):
        """Inside one iteration of a device-side loop: only the first is code, later ones repeat it."""
        self._device_loop_repeats += 0 if first else 1
        try:
            yield
        finally:
            self._device_loop_repeats -= 0 if first else 1

    def checkpoint(self) -> None:
        """Raise if the live allocations exceed usable SBUF or PSUM capacity; track the peaks."""
        if not self._allocated_since_check:
            return
        for buffer, limit, key in (("sbuf", self.target.sbuf_usable_bytes_per_partition, "peak_sbuf_bytes"),
                                   ("psum", self.psum_capacity(), "peak_psum_bytes")):
            if self.live[buffer] > limit:
                shape, size = self._last[buffer]
                usable = (f" (usable: {self.target.sbuf_bytes_per_partition} B physical minus "
                          f"{self.target.sbuf_reserved_bytes_per_partition} B the compiler reserves)"
                          if buffer == "sbuf" else "")
                raise NkiConstraintError(
                    f"{self.name}: allocating a {buffer.upper()} tile of shape {shape} ({size} B per "
                    f"partition) exceeds {buffer.upper()} capacity on {self.target.name}: "
                    f"{self.live[buffer] - size} B already live, limit {limit} B per partition{usable} "
                    f"[{'L4/X9' if buffer == 'sbuf' else 'L2'}; {self.target.name}, nki {self.api}]")
            setattr(self.trace, key, max(getattr(self.trace, key), self.live[buffer]))
        self._allocated_since_check = False

    def psum_capacity(self) -> int:
        """PSUM bytes per partition a kernel may allocate: 8 banks, or 7 where dma_transpose is lowered to
        PE transposes (NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE=true on trn2+, nki 0.4+: bank 7 is reserved for
        nc_transpose; tile_size.psum_num_banks, TILE_SIZE) [L2]."""
        reserved = (setting("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", "").strip().lower() == "true"
                    and self.target.name != "trn1" and self.api_at_least("0.4"))
        return self.target.psum_bytes_per_partition - (self.target.psum_bank_bytes if reserved else 0)

    def _release(self, buffer: str, per_partition: int) -> None:
        self.live[buffer] -= per_partition


class _LoopCode:
    """The compiled body of one device loop in the kernel's code: its entries once traced (None before the
    body first runs), and the code of the loops nested in it, by their position in it."""

    def __init__(self):
        self.body = None
        self.nested = {}


class _TracedLoop:
    """One execution of a traced device loop: its code (shared by every execution of the same loop in the
    kernel's code) and the position reached in the iteration being compared with it."""

    def __init__(self, what: str, code: _LoopCode):
        self.what = what
        self.code = code
        self.recording = False
        self.position = 0
        self.start_serial = 0
        self.iteration = -1

    def begin(self, serial: int) -> None:
        self.iteration += 1
        self.start_serial = serial
        self.position = 0
        self.recording = self.code.body is None
        if self.recording:
            self.code.body = []

    def record(self, entry, run) -> None:
        body = self.code.body
        if self.recording:
            body.append(entry)
            return
        if self.position >= len(body) or body[self.position] != entry:
            was = body[self.position] if self.position < len(body) else "the end of the body"
            self._diverged(run, f"issues {_describe(entry)} where the traced body issued {_describe(was)}")
        self.position += 1

    def code_of_nested_loop(self) -> _LoopCode:
        """The code of the loop that starts here (its entry was just recorded at position - 1)."""
        at = len(self.code.body) - 1 if self.recording else self.position - 1
        return self.code.nested.setdefault(at, _LoopCode())

    def end(self, run) -> None:
        if not self.recording and self.position != len(self.code.body):
            self._diverged(run, f"ends after {self.position} of the traced body's {len(self.code.body)} instructions "
                                "and allocations")
        self.recording = False

    def _diverged(self, run, text: str):
        raise NkiConstraintError(
            f"{run.name}: iteration {self.iteration} of {self.what} {text}: the compiler traces the body once "
            "and the device repeats that code, so state kept in Python across iterations (a counter, a "
            "list, a branch on a changing Python value) does not exist there; index with the loop "
            f"variable instead [L17; {run.target.name}, nki {run.api}]")


def _canonical(arg, starts):
    """An instruction argument as the compiled code sees it: a tile by its allocation (numbered from the
    start of the innermost open loop iteration it was allocated in; `starts`: the open iterations'
    first serials, outermost first), its offset unless the access is dynamic, shape and dtype; a
    register as 'register'; enums and operators by name; numbers by value."""
    if isinstance(arg, Tile):
        serial = arg.serial
        if serial is None:
            where = ("hbm-argument", id(arg._base or arg))
        else:
            level = next((n for n in range(len(starts) - 1, -1, -1) if serial >= starts[n]), None)
            where = ("outer", serial) if level is None else ("body", level, serial - starts[level])
        base = arg._base or arg
        offset = "dynamic" if arg.dynamic else (arg.data.ctypes.data - base.data.ctypes.data, arg.data.strides)
        return ("tile", where, offset, arg.shape, str(arg.dtype))
    if isinstance(arg, RegisterValue):
        return "register"
    if isinstance(arg, (tuple, list)):
        return tuple(_canonical(a, starts) for a in arg)
    if callable(arg) and hasattr(arg, "__name__"):
        return arg.__name__
    if isinstance(arg, np.ndarray):
        return ("array", arg.shape, arg.tobytes())
    return repr(arg)


def _describe(entry) -> str:
    if not isinstance(entry, tuple):
        return str(entry)
    name, args = entry[0], entry[1:]
    tiles = [a for a in args if isinstance(a, tuple) and a and a[0] == "tile"]
    shown = ", ".join(f"{a[1][0]} tile #{a[1][-1]} {a[3]}" + (" (dynamic)" if a[2] == "dynamic" else
                                                             f" at byte {a[2][0]}") for a in tiles[:3])
    return f"{name}({shown})"


def running() -> bool:
    """True inside an emulated kernel."""
    return _state.run is not None


def current_run(check=True) -> KernelRun:
    """The running kernel (every instruction calls this first: it is also a capacity checkpoint).
    Allocations pass check=False: a tile dies at its last use on the device, which the emulator
    sees only when its Python name is rebound after the next allocation, so capacity is checked
    at the next instruction (when every replaced tile is gone), not between allocations."""
    if _state.run is None:
        raise NkiConstraintError("NKI instruction called outside a kernel (no @nki.jit kernel is running)")
    if check:
        _state.run.checkpoint()
    return _state.run


@contextlib.contextmanager
def kernel_run(target: Target, name: str, api: str, program_id: int = 0, programs: int = 1,
               shared_outputs=None):
    previous, _state.run = _state.run, KernelRun(target, name, api, program_id, programs, shared_outputs)
    try:
        yield _state.run
    finally:
        _state.run = previous


class NkiTypeError(NkiConstraintError, TypeError):
    """A kernel used a device value as a Python one (AWS: the tracer raises TypeError)."""


class RegisterValue:
    """A run-time integer on the device: a register (`nisa.register_alloc`, nki 0.3+; a `VirtualRegister`),
    the loop variable of nl.fori_loop (a frozen register in 0.6, an `NkiScalar` in 0.7) or an NkiScalar
    of `nisa.scalar_load` (0.7). Its value exists only while the compiled code runs: it indexes tensors
    (the access becomes dynamic), bounds device loops, and under 0.7 combines with ints and scalars by
    +, - and * (int32, wrapping); Python cannot branch on it, convert it or use it as a Python int
    (`if i == 0:`, `range(i)`, `int(i)`, a list index): rule L17. The emulator carries the value of the
    iteration it is running in `value`; None: an uninitialised register."""

    __slots__ = ("value", "what", "frozen", "comparison")

    def __init__(self, value, what: str = "a register", frozen: bool = False, comparison: bool = False):
        self.value = None if value is None else wrap_int32(int(value))
        self.what = what
        self.frozen = frozen  # a loop variable: register_move/register_load may not write it
        self.comparison = comparison  # a comparison's result: "Traced, but the result cannot be used"

    def read(self) -> int:
        if self.comparison:
            self._python_use("a use of the result", "a comparison of an NkiScalar is traced, but its result cannot "
                                                    "be used (0.7's NkiScalar page)")
        if self.value is None:
            raise NkiConstraintError(f"{self.what} is read before any value was moved or loaded into it"
                                     + rule_tag("X14"))
        return self.value

    def _combine(self, other, op, symbol, swapped=False):
        comparison = symbol in ("==", "!=", "<", "<=", ">", ">=")
        if symbol not in ("+", "-", "*") and not comparison:
            self._python_use(f"'{symbol}'", "0.7's NkiScalar documents +, - and * (and comparisons whose "
                                            "result cannot be used)")
        if not isinstance(other, (int, np.integer, RegisterValue)) or isinstance(other, bool):
            self._python_use(f"'{symbol}' with {type(other).__name__} {other!r}", "an NkiScalar combines with ints "
                                                                                 "and other scalars only")
        run = _state.run
        if run is not None and not run.api_at_least("0.7"):
            self._python_use(f"Python arithmetic ('{symbol}')", "nki 0.6's loop variable is read-only and takes "
                                                                 "no Python arithmetic (0.7's NkiScalar does)")
        other = other.read() if isinstance(other, RegisterValue) else int(other)
        a, b = (other, self.read()) if swapped else (self.read(), other)
        return RegisterValue(op(a, b), self.what if self.what.startswith("an expression of") else
                             f"an expression of {self.what}", comparison=comparison)

    def __add__(self, other): return self._combine(other, operator.add, "+")
    def __radd__(self, other): return self._combine(other, operator.add, "+", True)
    def __sub__(self, other): return self._combine(other, operator.sub, "-")
    def __rsub__(self, other): return self._combine(other, operator.sub, "-", True)
    def __mul__(self, other): return self._combine(other, operator.mul, "*")
    def __rmul__(self, other): return self._combine(other, operator.mul, "*", True)
    def __floordiv__(self, other): return self._combine(other, operator.floordiv, "//")
    def __mod__(self, other): return self._combine(other, operator.mod, "%")
    def __lshift__(self, other): return self._combine(other, operator.lshift, "<<")
    def __rshift__(self, other): return self._combine(other, operator.rshift, ">>")
    def __truediv__(self, other): return self._combine(other, operator.truediv, "/")
    def __pow__(self, other): return self._combine(other, operator.pow, "**")
    def __neg__(self): return self._combine(0, operator.sub, "-", True)
    # comparisons are traced, but their result cannot be used (0.7's NkiScalar page): Python cannot branch on it
    def __eq__(self, other): return self._combine(other, lambda a, b: int(a == b), "==")
    def __ne__(self, other): return self._combine(other, lambda a, b: int(a != b), "!=")
    def __lt__(self, other): return self._combine(other, lambda a, b: int(a < b), "<")
    def __le__(self, other): return self._combine(other, lambda a, b: int(a <= b), "<=")
    def __gt__(self, other): return self._combine(other, lambda a, b: int(a > b), ">")
    def __ge__(self, other): return self._combine(other, lambda a, b: int(a >= b), ">=")
    __hash__ = None

    def _python_use(self, use: str, why: str = ""):
        run = _state.run
        kind = "an NkiScalar" if run is None or run.api_at_least("0.7") else "a VirtualRegister"
        raise NkiTypeError(
            f"{use} of {self.what}, {kind} whose value exists only on the device: "
            + (why or "the kernel is traced once, so Python cannot branch on it, convert it or use it as a "
               "Python int (index tensors with it, bound device loops with it)") + rule_tag("L17"))

    def __bool__(self): self._python_use("Python control flow (if/while/and/or)")
    def __index__(self): self._python_use("a Python int conversion (range, list index)")
    def __int__(self): self._python_use("int()")
    def __float__(self): self._python_use("float()")

    def __repr__(self):
        return f"register({self.what})"


def wrap_int32(value: int) -> int:
    """int32 arithmetic wraps (0.7's NkiScalar page: "int32 arithmetic wraps rather than widening")."""
    return ((value + 2 ** 31) % 2 ** 32) - 2 ** 31


def rule_tag(rule: str) -> str:
    """The suffix of a refusal: its row of docs/nki-audit.md, and the target and release of the running kernel."""
    run = _state.run
    return f" [{rule}]" if run is None else f" [{rule}; {run.target.name}, nki {run.api}]"


def _has_register(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    for item in items:
        parts = (item.start, item.stop, item.step) if isinstance(item, slice) else \
            (item.start, item.size) if hasattr(item, "size") and hasattr(item, "start") else (item,)
        if any(isinstance(part, RegisterValue) for part in parts):
            return True
    return False


class Tile:
    """An array in one of the NeuronCore's memories; slicing gives a view of the same memory.

    `written` is a boolean mask shared with the allocation: instructions set it on their
    destination, and reading an element no instruction wrote raises NkiConstraintError
    (the data itself is NaN there as well). `matmul_result` marks PSUM elements last written
    by a matmul, the only ones a later matmul may accumulate into. `dtype` is the NKI dtype: the
    numpy dtype of `data`, or BFLOAT16, whose values `data` holds as float32.
    """

    __slots__ = ("data", "written", "matmul_result", "buffer", "dtype", "_base", "_first_partition",
                 "scope_closed", "dynamic", "serial", "partition_step", "__weakref__")

    def __init__(self, data, written, matmul_result, buffer: str, base=None, first_partition: int = 0,
                 dtype=None):
        self.data = data
        self._first_partition = first_partition  # of an on-chip view, within its allocation
        self.written = written
        self.matmul_result = matmul_result  # holds a matmul result (accumulation is defined)
        self.buffer = buffer
        self.dtype = data.dtype if dtype is None else dtype
        self._base = base  # keeps the allocation alive (and accounted) while views exist
        self.scope_closed = False  # allocated in an nl.fori_loop body that has ended (rule L15)
        self.dynamic = False  # a view indexed by a loop register: its offset changes per iteration
        self.partition_step = 1  # an on-chip view's stride over partitions (DMA only: engines need 1, X5)
        self.serial = base.serial if base is not None else None  # allocation number (KernelRun.allocate)

    @property
    def shape(self):
        return self.data.shape

    @property
    def on_chip(self) -> bool:
        return self.buffer in ("sbuf", "psum")

    @property
    def out_of_scope(self) -> bool:
        """True for a tile (or view) allocated inside an nl.fori_loop body that has ended."""
        return (self._base or self).scope_closed

    @property
    def partitions(self) -> tuple:
        """(first partition, number of partitions) of an on-chip tile or view."""
        return self._first_partition, self.shape[0]

    def __getitem__(self, index):
        on_chip = self.on_chip
        dynamic = _has_register(index)
        index = _normalise_index(index, self.data.shape, keep_partition=on_chip)
        # axis 0 stays a slice on chip
        first = self._first_partition + index[0].start * self.partition_step if on_chip else 0
        view = Tile(self.data[index], self.written[index], self.matmul_result[index], self.buffer,
                    self._base or self, first, self.dtype)
        view.dynamic = self.dynamic or dynamic
        if on_chip:
            view.partition_step = self.partition_step * (index[0].step or 1)
        return view

    def reshape(self, shape):
        """A view of another shape over the same elements (LANG-0.6 tensor views): the element count
        kept (V1), an on-chip tile's partition axis kept (L6), a contiguous source (V2)."""
        shape = tuple(int(n) for n in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        if math.prod(shape) != self.data.size or any(n <= 0 for n in shape):
            raise NkiConstraintError(
                f"reshape {self.shape} -> {shape}: a view keeps the element count ({self.data.size} elements "
                f"into {math.prod(shape)})" + rule_tag("V1"))
        if self.on_chip and shape[0] != self.shape[0]:
            raise NkiConstraintError(
                f"reshape {self.shape} -> {shape} would move data across partitions "
                "(an on-chip tile keeps its partition axis)" + rule_tag("L6"))
        data = self.data.reshape(shape)
        if not np.shares_memory(data, self.data):
            raise NkiConstraintError(f"reshape of a non-contiguous view {self.shape} -> {shape}: a view "
                                     "cannot reorder memory (copy it first)" + rule_tag("V2"))
        return self._view(data, self.written.reshape(shape), self.matmul_result.reshape(shape))

    def permute(self, dims):
        """A view with the axes reordered (LANG-0.6 tensor views): dims a permutation of the axes; on chip
        dims[0] == 0, the partition axis stays first [V3]."""
        dims = tuple(int(d) for d in dims)
        if sorted(dims) != list(range(len(self.shape))):
            raise NkiConstraintError(f"permute{dims} of a tensor {self.shape}: dims must be a permutation of its "
                                     f"{len(self.shape)} axes" + rule_tag("V3"))
        if self.on_chip and dims[0] != 0:
            raise NkiConstraintError(f"permute{dims} of an on-chip tile {self.shape}: dims[0] must be 0 (the partition "
                                     "axis stays first; move data across partitions with a transpose)" + rule_tag("V3"))
        return self._view(np.transpose(self.data, dims), np.transpose(self.written, dims),
                          np.transpose(self.matmul_result, dims))

    def broadcast(self, dim, size):
        """A read-only view repeating axis `dim` (of size 1) `size` times (LANG-0.6): not the partition axis
        of an on-chip tile [V4]."""
        dim, size = int(dim), int(size)
        if not 0 <= dim < len(self.shape) or self.shape[dim] != 1 or size < 1 or (self.on_chip and dim == 0):
            raise NkiConstraintError(f"broadcast({dim}, {size}) of a tensor {self.shape}: the axis must have size 1 "
                                     "and not be the partition axis of an on-chip tile" + rule_tag("V4"))
        shape = self.shape[:dim] + (size,) + self.shape[dim + 1:]
        return self._view(np.broadcast_to(self.data, shape), np.broadcast_to(self.written, shape),
                          np.broadcast_to(self.matmul_result, shape))

    def _view(self, data, written, matmul_result):
        view = Tile(data, written, matmul_result, self.buffer, self._base or self, self._first_partition, self.dtype)
        view.dynamic, view.partition_step = self.dynamic, self.partition_step
        return view

    def __setitem__(self, index, value):
        raise NkiConstraintError(
            "item assignment into a tile is not an NKI instruction: use nisa.* with a dst argument")

    def __repr__(self):
        return f"Tile({self.buffer}, shape={self.shape}, dtype={self.dtype})"


def _normalise_index(index, shape, keep_partition):
    """Ints, slices, nl.ds(start, size) and one Ellipsis, checked against the tile, with Python's
    meaning of negative indices and bounds (LANG-0.6: NKI tensors index as numpy arrays do; rows
    IX1-IX3 of docs/nki-audit.md). An int drops its axis, except the partition axis (0) of an
    on-chip tile, which stays as a size-1 slice, and on chip a result stays at least 2-D."""
    if not isinstance(index, tuple):
        index = (index,)
    ellipses = sum(item is Ellipsis for item in index)
    if ellipses > 1:
        raise NkiConstraintError(f"an index can only have a single ellipsis ('...'): {index!r}" + rule_tag("IX1"))
    if ellipses:
        at = next(n for n, item in enumerate(index) if item is Ellipsis)
        fill = len(shape) - (len(index) - 1)
        index = index[:at] + (slice(None),) * max(fill, 0) + index[at + 1:]
    if len(index) > len(shape):
        raise NkiConstraintError(f"{len(index)} indices for a tile of shape {tuple(shape)}" + rule_tag("IX3"))
    out = []
    for axis, item in enumerate(index):
        item = _concrete(item)
        if hasattr(item, "start") and hasattr(item, "size") and not isinstance(item, slice):
            item = _dynamic_slice(item, axis, shape)
        if isinstance(item, slice):
            out.append(_checked_slice(item, axis, shape))
        elif isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            if not -shape[axis] <= item < shape[axis]:
                raise NkiConstraintError(
                    f"index {item} is outside axis {axis} of a tile of shape {tuple(shape)}" + rule_tag("IX3"))
            item = int(item) % shape[axis]  # -1: the last element, as in Python
            keep = keep_partition and axis == 0
            out.append(slice(item, item + 1) if keep else item)
        else:
            raise NkiConstraintError(f"unsupported index {item!r} on axis {axis} (ints, slices, nl.ds and one "
                                     "Ellipsis)" + rule_tag("IX2"))
    if keep_partition and len(shape) >= 2:
        kept = 1 + sum(not isinstance(item, int) for item in out[1:]) + (len(shape) - len(out))
        if kept < 2:  # on chip, a result stays 2-D: the last free dim indexed by an int is kept at 1
            last = max(n for n, item in enumerate(out) if n and isinstance(item, int))
            out[last] = slice(out[last], out[last] + 1)
    return tuple(out)


def _dynamic_slice(item, axis, shape) -> slice:
    """nl.ds(start, size): start an int or a register (its current value), size a compile-time int (IX2)."""
    if not _index_int(item.size):
        raise NkiConstraintError(f"nl.ds(start, size) with size {item.size!r} on axis {axis}: the size must "
                                 "be a compile-time int (a run-time start is allowed)" + rule_tag("IX2"))
    if not (_index_int(item.start) or isinstance(item.start, RegisterValue)):
        raise NkiConstraintError(f"nl.ds(start, size) with start {item.start!r} on axis {axis}: the start is "
                                 "an int or a register" + rule_tag("IX2"))
    start, size = _concrete(item.start), int(item.size)
    if start < 0 or size <= 0 or start + size > shape[axis]:
        raise NkiConstraintError(f"nl.ds({start}, {size}) is empty or outside axis {axis} of a tile of "
                                 f"shape {tuple(shape)}" + rule_tag("IX3"))
    return slice(start, start + size)


def _checked_slice(item: slice, axis, shape) -> slice:
    """A Python slice of int bounds (negative: from the end; no clamping) and a positive step (X5, IX2, IX3)."""
    parts = (item.start, item.stop, item.step)
    if any(isinstance(v, RegisterValue) for v in parts):
        raise NkiConstraintError(f"slice {item} on axis {axis} has a register bound: a run-time access needs a "
                                 "compile-time size, nl.ds(start, size)" + rule_tag("IX2"))
    if not all(v is None or _index_int(v) for v in parts):
        raise NkiConstraintError(f"slice {item} on axis {axis}: bounds and step are ints" + rule_tag("IX2"))
    start, stop, step = parts
    if step is not None and step <= 0:
        raise NkiConstraintError(f"slice step {step} on axis {axis} of a tile of shape {tuple(shape)}: a step "
                                 "must be positive" + rule_tag("X5"))
    n = shape[axis]
    start = 0 if start is None else start + n if start < 0 else start  # -k: k from the end
    stop = n if stop is None else stop + n if stop < 0 else stop
    if not 0 <= start < stop <= n:
        raise NkiConstraintError(
            f"slice {item.start}:{item.stop} is empty or outside axis {axis} of a tile of shape "
            f"{tuple(shape)} (no clamping: an access outside the tensor is an error)" + rule_tag("IX3"))
    return slice(start, stop, None if step in (None, 1) else step)


def _index_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_int32(value) -> bool:
    """value is a Python or numpy int (not a bool) of 32 bits: a register's and a device loop bound's range."""
    return _index_int(value) and -2 ** 31 <= int(value) < 2 ** 31


def _concrete(value):
    """An index component's value: a loop register (NkiScalar) reads as its current value here, the
    view it makes is marked dynamic by Tile.__getitem__; everything else as given."""
    return value.read() if isinstance(value, RegisterValue) else value
