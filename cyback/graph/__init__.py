"""The symbolic graph: tensors (``tensor``), the ``Op`` interface (``op``),
compiled functions and their planner (``function``, ``optimize``, ``fusion``,
``frozen``, ``codegen``) and pickling (``pickling``).

The graph knows no particular op and no Keras: it asks each op through the
hooks of ``Op`` (see ``op.py``). It may import config and kernels, never ops,
the API or Keras; what it needs from above is registered with it
(``register_reducer``, ``register_list_stacker``, ``register_moved``). Inside
it, a module imports only the ones below it (pyproject.toml's contracts):
``pickling`` over ``function`` over ``frozen`` and ``optimize`` over
``fusion`` over ``op`` over ``tensor``; ``tensor``'s ``eval`` and
``__reduce__`` are attached by ``function`` and ``pickling``.
"""
