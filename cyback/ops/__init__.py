"""The ops: each ``Op`` subclass keeps its shape rule (``infer``), its compute
and its gradient side by side (the contract is in ``cyback.graph.op``).

Also here is what builds graphs out of ops: reverse-mode differentiation
(``gradients``) and the loop op ``Scan`` with its gradient (``scan``,
``scan_cells``). Ops may import the graph, config and kernels, never the API.
"""
