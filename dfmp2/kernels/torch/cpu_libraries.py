"""The libraries a CPU product can run on (kernels.torch.cpu_gemm chooses among them by measuring), each as
C = A @ B of CPU torch tensors with torch.matmul's shapes, and what each runs on this machine:

    mkl       torch.matmul: torch's BLAS, oneMKL in the pinned wheel (fp32, fp64)
    onednn    torch.ops.mkldnn._linear_pointwise: oneDNN's matmul, which picks its kernels by the
              CPU's ISA, not its vendor (fp32 only: oneDNN has no fp64 matmul)
    openblas  numpy.matmul on zero-copy views: numpy's OpenBLAS, with the kernels it detects or
              those OPENBLAS_CORETYPE pins (the user's pin is respected and recorded)
and the triangular solves B = X L^-T (the whitenings), as `_SOLVES`:
    mkl             torch.linalg.solve_triangular (fp32, fp64)
    scipy-openblas  scipy.linalg.blas ?trsm on the tensors' memory: SciPy's own OpenBLAS (numpy's
                    has no solve numpy calls), OPENBLAS_CORETYPE respected as for numpy's
"""

from __future__ import annotations

import functools
import os
import tempfile

import numpy as np
import torch

from ...util import cpu_config, environment

_DTYPES = {torch.float32: "fp32", torch.float64: "fp64"}


def _mkl(a, b, out=None):
    return torch.matmul(a, b, out=out) if out is not None else torch.matmul(a, b)


def _dense(x):
    """x where it is a dense row- or column-major matrix (oneDNN takes either), else a dense copy:
    a column slice of a wider matrix (leading dimension above its width) made oneDNN run a reference
    path at 0.2 GF/s where the same product on dense operands ran at 150-220 (AMD EPYC, Zen 5); the
    copy is O(m k) of the product's O(m k n)."""
    return x if x.is_contiguous() or x.transpose(-1, -2).is_contiguous() else x.contiguous()


def _onednn(a, b, out=None):
    """oneDNN's matmul through torch: linear(x, w) = x w^T, so C = A B is linear(A, B^T) (a view);
    batched operands (torch.matmul's broadcasting) one 2-D product per matrix of the batch."""
    if a.dim() == 2 and b.dim() == 2:
        c = torch.ops.mkldnn._linear_pointwise(_dense(a), _dense(b).transpose(0, 1), None, "none", [], "")
        if out is None:
            return c
        out.copy_(c)
        return out
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a_all, b_all = a.expand(*batch, *a.shape[-2:]), b.expand(*batch, *b.shape[-2:])
    out = out if out is not None else torch.empty((*batch, a.shape[-2], b.shape[-1]), dtype=a.dtype)
    for index in np.ndindex(*batch):
        out[index].copy_(torch.ops.mkldnn._linear_pointwise(_dense(a_all[index]), _dense(b_all[index]).transpose(0, 1),
                                                            None, "none", [], ""))
    return out


def _openblas(a, b, out=None):
    """numpy.matmul on the tensors' memory (no copy where the strides are a GEMM's)."""
    if out is not None:
        np.matmul(a.numpy(), b.numpy(), out=out.numpy())
        return out
    return torch.from_numpy(np.matmul(a.numpy(), b.numpy()))


_CALLS = {"mkl": _mkl, "onednn": _onednn, "openblas": _openblas}


# ---- the triangular solves B = X L^-T (the whitenings): the libraries that have one

def _solve_mkl(lower, rows):
    """torch.linalg.solve_triangular: torch's own (oneMKL in the pinned wheel)."""
    return torch.linalg.solve_triangular(lower.transpose(0, 1), rows, upper=True, left=False)


def _solve_scipy_openblas(lower, rows):
    """SciPy's OpenBLAS ?trsm on the tensors' memory: rows X [m, n] (row-major) is R = X^T [n, m]
    to Fortran, and X L^-T = (L^-1 R)^T: a left-side solve with op(A) = L, where A = L^T is lower's
    row-major memory (upper to Fortran); the result is made in a copy of X (the input is kept)."""
    from scipy.linalg import blas

    solve = blas.dtrsm if rows.dtype == torch.float64 else blas.strsm
    out = torch.empty(rows.shape, dtype=rows.dtype)
    out.copy_(rows)
    solved = solve(1.0, lower.contiguous().numpy().T, out.numpy().T, side=0, lower=0, trans_a=1, overwrite_b=1)
    if not np.shares_memory(solved, out.numpy()):  # (f2py copied: never for these layouts)
        out.copy_(torch.from_numpy(solved.T))
    return out


# library -> the solve (the same precisions as its GEMMs: util.cpu_config.SOLVE_LIBRARIES)
_SOLVES = {"mkl": _solve_mkl, "scipy-openblas": _solve_scipy_openblas}


def _takes(library: str, a, b) -> bool:
    """Whether `library` computes in this product's precision."""
    return _DTYPES.get(a.dtype) in cpu_config.GEMM_LIBRARIES[library]


def onednn_available() -> str | None:
    """None where torch's oneDNN matmul runs here, else why not."""
    if not torch.backends.mkldnn.is_available():
        return "torch was built without oneDNN"
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return "this torch has no torch.ops.mkldnn._linear_pointwise"
    return None


def _available(library: str) -> str | None:
    return onednn_available() if library == "onednn" else None


@functools.lru_cache(maxsize=1)  # (constant in a process; read for every record)
def library_versions() -> dict:
    """The versions of what each library runs: torch (its MKL and oneDNN), numpy and its OpenBLAS."""
    config = torch.__config__.show()

    def after(marker):
        start = config.find(marker)
        return config[start + len(marker):].split()[0].strip("()") if start >= 0 else None

    mkl = after("Math Kernel Library Version ")
    return {"torch": torch.__version__, "mkl": mkl.split("-")[0] if mkl else None,
            "onednn": after("MKL-DNN v"), "numpy": np.__version__,
            "openblas": (_openblas_info() or {}).get("version"),
            "scipy_openblas": _scipy_blas_version()}


def _scipy_blas_version():
    """The version of the OpenBLAS SciPy was built with (its build configuration: reading it does not
    load that library, whose thread buffers `dfmp2 info` under a tight rlimit must not map), or None."""
    try:
        import scipy

        blas = scipy.__config__.CONFIG["Build Dependencies"]["blas"]
    except (ImportError, AttributeError, KeyError, TypeError):
        return None
    return blas.get("version") if "openblas" in str(blas.get("name", "")).lower() else None


@functools.lru_cache(maxsize=2)
def _openblas_info(package="numpy"):
    """threadpoolctl's entry for the OpenBLAS `package` ships (numpy's numpy.libs/, SciPy's
    scipy.libs/: two libraries, each with its own version and threads), or None."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    if package == "scipy":
        import scipy.linalg  # noqa: F401  (loads SciPy's OpenBLAS, so that threadpoolctl sees it)
    for info in threadpool_info():
        if info.get("internal_api") == "openblas" and f"{os.sep}{package}" in info.get("filepath", ""):
            return info
    return None


@functools.lru_cache(maxsize=1)  # (read once a process)
def _onednn_kernels() -> str:
    """The implementation oneDNN picks for an fp32 matmul here (e.g. "brg_matmul:avx512_core"), from
    its verbose output of one small product (standard output captured for that call only)."""
    found = "not reported"
    with tempfile.TemporaryFile() as captured:
        saved = os.dup(1)
        try:
            os.dup2(captured.fileno(), 1)
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                small = torch.ones((8, 8))
                _onednn(small, small)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        captured.seek(0)
        for line in captured.read().decode(errors="replace").splitlines():
            fields = line.split(",")
            if "primitive" in fields and "exec" in fields and len(fields) > 6:
                found = f"{fields[6]} ({fields[5]})"  # e.g. brg_matmul:avx512_core (inner_product)
    return found


def kernels(library: str) -> str:
    """What `library` runs on this machine, in words: OpenBLAS's architecture (threadpoolctl), oneDNN's
    implementation (its verbose line), MKL's version (MKL picks its code path itself and does not say)."""
    versions = library_versions()
    if library in ("openblas", "scipy-openblas"):
        info = _openblas_info("scipy" if library == "scipy-openblas" else "numpy") or {}
        pin = environment.get("OPENBLAS_CORETYPE")
        return (("SciPy's " if library == "scipy-openblas" else "")
                + f"OpenBLAS {info.get('version', '?')} {info.get('architecture', '?')} kernels"
                + (f" (OPENBLAS_CORETYPE={pin}, respected)" if pin else " (as it detects this CPU)"))
    if library == "onednn":
        return f"oneDNN {versions['onednn']} {_onednn_kernels()}"
    return f"oneMKL {versions['mkl']} (its own dispatch; the ISA is not reported)"
