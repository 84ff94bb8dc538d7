"""The torch backend (cpu, cuda): TorchBackend (backend.py) and what it runs on: torch's own kernels, the
host BLAS libraries of a CPU (cpu_gemm.py, cpu_solves.py, cpu_libraries.py), split-precision GEMMs
(split_gemm.py), CUDA's fused pair epilogue (cuda_pair.py), the SCF's fitted store (fitted.py), block-sparse
products (sparse.py, products.py) and pinned host staging (pinned_staging.py). Inside this package
`import torch` is PyTorch (absolute imports)."""
