"""cyback's benchmarks against the installed peers (``python -m cyback.bench``).

The timing method is in :mod:`cyback.bench.timing`; op-level cases in
:mod:`cyback.bench.ops`, model-level ones in :mod:`cyback.bench.models`.
"""
