"""The torch backend (cpu, cuda): TorchBackend (backend.py) and the kernels it runs, torch's own, the host
BLAS libraries (cpu_gemm, cpu_solves, cpu_libraries), split-precision GEMMs (split_gemm) and CUDA's pair
epilogue (cuda_pair). Inside this package `import torch` is PyTorch (absolute imports)."""
