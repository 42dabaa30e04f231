"""Python's cycle collector held off while a whole graph is walked.

Compiling a plan (and differentiating a graph) makes a few objects per node
that live until the pass ends. Python counts them towards its next full
collection, which walks every object of the process: on a graph of n nodes a
pass would pay for several such walks, each in proportion to n, and the
number of walks grows with n too: collection alone would make compiling an
unrolled RNN super-linear. Passes run inside ``paused()``: the collector is
off until the outermost paused block in any thread ends, then on again if it
was on when the first one began. Reference counting still frees everything
that is not in a cycle meanwhile, and the cycles a pass leaves are collected
afterwards as usual.

A program that switches the collector on or off itself while another thread
compiles may see its setting replaced when that compile ends.
"""
import contextlib
import gc
import threading

_lock = threading.Lock()
_state = {"depth": 0, "was_enabled": False}


@contextlib.contextmanager
def paused():
    """Run the block with the cycle collector off (see the module docstring)."""
    with _lock:
        if _state["depth"] == 0:
            _state["was_enabled"] = gc.isenabled()
            gc.disable()
        _state["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["depth"] -= 1
            if _state["depth"] == 0 and _state["was_enabled"]:
                gc.enable()
