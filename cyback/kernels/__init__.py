"""Compiled kernels on NumPy arrays (Cython + OpenMP, BLAS from SciPy or NumPy: blas_threads).

Each kernel module has a Python entry that takes NumPy arrays, so benchmarks
and the ops call the same code. Kernels know arrays only: they import
nothing from cyback outside this package (an import-linter contract in
pyproject.toml; tests/kernels/test_layering.py checks the .pyx sources,
which import-linter does not read).
"""
