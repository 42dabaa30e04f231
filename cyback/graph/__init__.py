"""The symbolic graph: tensors (``tensor``), the ``Op`` interface (``op``),
compiled functions and their planner (``function``, ``optimize``, ``fusion``,
``frozen``) and pickling.

The graph knows no particular op: it asks each op through the hooks of
``Op`` (see ``op.py``). It may import config and kernels, never ops or the
API; what it needs from above is registered with it (``register_reducer``,
``register_list_stacker``).
"""
