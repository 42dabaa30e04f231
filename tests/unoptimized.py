"""The graph as written, for tests that compare an optimized plan with it:
plans made with the graph optimizer off (a function's plan is made by its
first call), the switch put back afterwards."""
import contextlib

import cyback as K


@contextlib.contextmanager
def optimizer_off():
    K.set_graph_optimizer(False)
    try:
        yield
    finally:
        K.set_graph_optimizer(True)


def run_unoptimized(inputs, outputs, feeds):
    """``K.function(inputs, outputs)(feeds)`` with the optimizer off."""
    with optimizer_off():
        return K.function(inputs, outputs)(feeds)


def optimized_and_plain(inputs, output, feeds):
    """(the optimized function's result, the graph as written's, the class
    names of the optimized plan's ops, the optimized function) for one
    output."""
    optimized = K.function(inputs, [output])
    got = optimized(feeds)[0]
    want = run_unoptimized(inputs, [output], feeds)[0]
    return got, want, [type(op).__name__ for op in optimized.plan_ops()], optimized
