"""Fuzzing the backend API: every function called with random shapes (0 and 1
included), dtypes and argument values, built and then evaluated. Each call
must give a result or raise a ValueError/TypeError whose message names the
function; any other exception (IndexError, ZeroDivisionError, an error naming
nothing, ...) is a failure, unless it is listed in KNOWN (defects found and
not fixed yet; the long run counts them in the "known" column).

Seeded: the CI budget is small (``CYBACK_FUZZ_CALLS``, default 600 calls,
about a second or two). A long run prints the outcome counts per function:

    CYBACK_FUZZ_CALLS=100000 python tests/test_fuzz.py [--seed S]

(or ``pytest tests/test_fuzz.py`` with the variable set).
"""
import collections
import os
import sys
import warnings

import numpy as np

import cyback as K
from cyback.graph.tensor import Tensor

DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8", "bool"]
FLOATS = ["float32", "float64"]
DIMS = [0, 1, 1, 2, 3, 4]


class Gen(object):
    """Random argument values, from a seeded generator."""

    def __init__(self, seed):
        self.r = np.random.RandomState(seed)

    def pick(self, seq):
        return seq[self.r.randint(len(seq))]

    def chance(self, p):
        return self.r.rand() < p

    def shape(self, ndim=None, lo=0, hi=4):
        if ndim is None:
            ndim = self.r.randint(lo, hi + 1)
        return tuple(self.pick(DIMS) for _ in range(ndim))

    def array(self, shape=None, dtype=None, ndim=None):
        shape = self.shape(ndim) if shape is None else shape
        dtype = dtype or self.pick(DTYPES)
        if dtype == "bool":
            return np.asarray(self.r.rand(*shape) < 0.5)
        if dtype.startswith(("int", "uint")):
            return self.r.randint(0 if dtype.startswith("u") else -3, 4, size=shape).astype(dtype)
        return np.asarray(self.r.randn(*shape) * self.pick([1, 1, 1e-3, 1e3])).astype(dtype)

    def tensor(self, shape=None, dtype=None, ndim=None, feeds=None):
        """A constant, a variable, or a placeholder (fed at evaluation)."""
        value = self.array(shape, dtype, ndim)
        how = self.r.randint(4)
        if how == 0 or feeds is None:
            return K.constant(value, dtype=str(value.dtype))
        if how == 1 and value.dtype != np.bool_:
            return K.variable(value, dtype=str(value.dtype))
        static = tuple(None if self.chance(0.4) else d for d in value.shape)
        ph = K.placeholder(static, dtype=str(value.dtype))
        feeds[ph] = value
        return ph

    def ftensor(self, feeds, shape=None, ndim=None):
        return self.tensor(shape, self.pick(FLOATS), ndim, feeds)

    def axis(self, ndim=4):
        return self.pick([None, None, self.r.randint(-ndim - 1, ndim + 1),
                          [self.r.randint(-ndim, ndim) for _ in range(self.r.randint(0, 3))],
                          (0, 0), 1.5, "x", True])

    def count(self):
        return self.pick([-1, 0, 1, 1, 2, 3, 2.5, None, True])

    def scalar(self):
        return self.pick([0.0, 1.0, -1.0, 0.5, 2, np.nan, np.inf, -1e30, None, "a",
                          np.float32(0.3)])

    def data_format(self):
        return self.pick(["channels_last", "channels_first", None, "NHWC", 3])

    def padding(self):
        return self.pick(["valid", "same", "causal", "full", None])

    def ints(self, n, lo=-1, hi=3):
        if self.chance(0.2):
            return self.pick([self.r.randint(lo, hi + 1), None, [1] * (n + 1), "2"])
        return tuple(int(self.r.randint(lo, hi + 1)) for _ in range(n))

    def dtype(self):
        return self.pick(DTYPES + [None, "float8", 3])


def _unary(name):
    return name, lambda g, f: ((g.tensor(feeds=f),), {})


def _binary(name):
    def args(g, f):
        a = g.tensor(feeds=f)
        if g.chance(0.5):
            b = g.tensor(shape=a.shape if None not in a.shape else None, feeds=f)
        else:
            b = g.pick([g.tensor(feeds=f), 2.0, -1, np.ones(3)])
        return (a, b), {}
    return name, args


def _reduction(name):
    return name, lambda g, f: ((g.tensor(feeds=f), g.axis()), {"keepdims": g.pick([False, True])})


def _conv(name, nd, transpose=False):
    def args(g, f):
        fmt = g.data_format()
        x = g.ftensor(f, ndim=g.pick([nd + 2, nd + 2, nd + 1]))
        k = g.ftensor(f, ndim=g.pick([nd + 2, nd + 2, nd]))
        kw = {"strides": g.ints(nd, 0, 2) if nd > 1 else g.pick([1, 2, 0]),
              "padding": g.padding(), "data_format": fmt}
        if transpose:
            return (x, k, g.ints(nd + 2, 0, 4)), kw
        kw["dilation_rate"] = g.ints(nd, 0, 2) if nd > 1 else g.pick([1, 2, 0])
        return (x, k), kw
    return name, args


def _random(name, two):
    def args(g, f):
        a = g.shape(lo=0, hi=3) if not g.chance(0.2) else g.pick([(-1, 2), None, 3, "x"])
        extra = (g.scalar(), g.scalar()) if two else (g.pick([0.0, 0.5, 1.0, 2.0, -0.1, np.nan]),)
        return (a,) + extra, {"dtype": g.pick(FLOATS + [None, "int32"]), "seed": g.pick([None, 1])}
    return name, args


def _step(x_t, states):
    out = K.tanh(x_t + K.sum(states[0]))
    return out, [states[0] * 0.5]


SPECS = dict([
    _unary("abs"), _unary("square"), _unary("sqrt"), _unary("exp"), _unary("log"),
    _unary("round"), _unary("sign"), _unary("sin"), _unary("cos"), _unary("tanh"),
    _unary("sigmoid"), _unary("hard_sigmoid"), _unary("softplus"), _unary("softsign"),
    _unary("transpose"), _unary("flatten"), _unary("batch_flatten"), _unary("zeros_like"),
    _unary("ones_like"), _unary("identity"), _unary("stop_gradient"), _unary("shape"),
    _unary("softmax"),
    _binary("maximum"), _binary("minimum"), _binary("equal"), _binary("not_equal"),
    _binary("greater"), _binary("greater_equal"), _binary("less"), _binary("less_equal"),
    _binary("dot"),
    _reduction("sum"), _reduction("prod"), _reduction("mean"), _reduction("max"),
    _reduction("min"), _reduction("var"), _reduction("std"), _reduction("any"),
    _reduction("all"), _reduction("logsumexp"),
    ("argmax", lambda g, f: ((g.tensor(feeds=f), g.pick([-1, 0, 1, 3, -5, None])), {})),
    ("argmin", lambda g, f: ((g.tensor(feeds=f), g.pick([-1, 0, 1, 3, -5])), {})),
    ("cumsum", lambda g, f: ((g.tensor(feeds=f), g.pick([0, 1, -1, 4, None])), {})),
    ("cumprod", lambda g, f: ((g.tensor(feeds=f), g.pick([0, 1, -1, 4])), {})),
    ("pow", lambda g, f: ((g.tensor(feeds=f), g.pick([2, 0.5, -1, 0, 3.0, "a"])), {})),
    ("clip", lambda g, f: ((g.tensor(feeds=f), g.scalar(), g.scalar()), {})),
    ("cast", lambda g, f: ((g.tensor(feeds=f), g.dtype()), {})),
    ("relu", lambda g, f: ((g.tensor(feeds=f),), {"alpha": g.pick([0.0, 0.1, -1.0]),
                                                  "max_value": g.pick([None, 6.0, -1.0, 0.0])})),
    ("elu", lambda g, f: ((g.tensor(feeds=f), g.pick([1.0, 0.0, -1.0])), {})),
    ("l2_normalize", lambda g, f: ((g.tensor(feeds=f), g.pick([None, 0, -1, 5])), {})),
    ("batch_dot", lambda g, f: ((g.ftensor(f), g.ftensor(f)),
                                {"axes": g.pick([None, 1, 2, (1, 2), (2, 1), [1, 1], -1])})),
    ("concatenate", lambda g, f: (([g.tensor(feeds=f) for _ in range(g.r.randint(0, 3))],),
                                  {"axis": g.pick([-1, 0, 1, 3])})),
    ("stack", lambda g, f: (([g.tensor(feeds=f) for _ in range(g.r.randint(0, 3))],),
                            {"axis": g.pick([0, 1, -1, 5])})),
    ("reshape", lambda g, f: ((g.tensor(feeds=f), g.pick([(-1,), (2, -1), (0,), (-1, -1), ()])),
                              {})),
    ("permute_dimensions", lambda g, f: ((g.tensor(feeds=f),
                                          tuple(g.r.permutation(g.r.randint(0, 4)))), {})),
    ("expand_dims", lambda g, f: ((g.tensor(feeds=f), g.pick([-1, 0, 1, 5, -6])), {})),
    ("squeeze", lambda g, f: ((g.tensor(feeds=f), g.pick([0, 1, -1, 4])), {})),
    ("repeat_elements", lambda g, f: ((g.tensor(feeds=f), g.count(), g.pick([0, 1, -1, 4])),
                                      {})),
    ("repeat", lambda g, f: ((g.ftensor(f, ndim=g.pick([2, 2, 1, 3])), g.count()), {})),
    ("tile", lambda g, f: ((g.tensor(feeds=f), g.pick([2, (1, 2), [0, 1, 1], -1, ()])), {})),
    ("reverse", lambda g, f: ((g.tensor(feeds=f), g.pick([0, -1, (0, 1), [], 5])), {})),
    ("slice", lambda g, f: ((g.tensor(feeds=f), g.ints(2, -1, 2), g.ints(2, -1, 2)), {})),
    ("gather", lambda g, f: ((g.tensor(feeds=f),
                              g.tensor(dtype=g.pick(["int32", "int64", "float32"]), feeds=f)),
                             {})),
    ("one_hot", lambda g, f: ((g.tensor(dtype=g.pick(["int32", "int64", "float32"]), feeds=f),
                               g.count()), {})),
    ("arange", lambda g, f: ((g.pick([0, 3, -2, 2.5]), g.pick([None, 5, 0, -3])),
                             {"step": g.pick([1, 2, -1, 0, 0.5]),
                              "dtype": g.pick(["int32", "float32", "bool", "x"])})),
    ("eye", lambda g, f: ((g.pick([0, 1, 3, -1, (2, 3), 2.5]),), {"dtype": g.dtype()})),
    ("zeros", lambda g, f: ((g.shape() if g.chance(0.8) else g.pick([(-1,), 3, None]),),
                            {"dtype": g.dtype()})),
    ("ones", lambda g, f: ((g.shape() if g.chance(0.8) else g.pick([(-1,), 3, None]),),
                           {"dtype": g.dtype()})),
    ("temporal_padding", lambda g, f: ((g.tensor(feeds=f), g.ints(2, -1, 2)), {})),
    ("spatial_2d_padding", lambda g, f: ((g.tensor(feeds=f, ndim=g.pick([4, 4, 3])),
                                          (g.ints(2, -1, 2), g.ints(2, 0, 2))),
                                         {"data_format": g.data_format()})),
    ("resize_images", lambda g, f: ((g.tensor(feeds=f, ndim=g.pick([4, 4, 3])), g.count(),
                                     g.count(), g.data_format()), {})),
    ("bias_add", lambda g, f: ((g.tensor(feeds=f), g.tensor(feeds=f, ndim=g.pick([1, 1, 2]))),
                               {"data_format": g.data_format()})),
    ("dropout", lambda g, f: ((g.ftensor(f), g.pick([0.0, 0.5, 1.0, -0.1, 0.999])),
                              {"seed": g.pick([None, 3])})),
    ("categorical_crossentropy", lambda g, f: (
        (g.ftensor(f), g.ftensor(f)), {"from_logits": g.pick([False, True])})),
    ("binary_crossentropy", lambda g, f: (
        (g.ftensor(f), g.ftensor(f)), {"from_logits": g.pick([False, True])})),
    ("sparse_categorical_crossentropy", lambda g, f: (
        (g.tensor(dtype=g.pick(["int32", "float32"]), feeds=f), g.ftensor(f)),
        {"from_logits": g.pick([False, True])})),
    ("in_top_k", lambda g, f: ((g.ftensor(f, ndim=g.pick([2, 2, 1])),
                                g.tensor(dtype="int32", ndim=1, feeds=f), g.count()), {})),
    ("batch_normalization", lambda g, f: (
        (g.ftensor(f), g.ftensor(f), g.ftensor(f), g.ftensor(f), g.ftensor(f)),
        {"epsilon": g.pick([1e-3, 0.0, -1.0])})),
    ("conv1d",) + (_conv("conv1d", 1)[1],), ("conv2d",) + (_conv("conv2d", 2)[1],),
    ("conv3d",) + (_conv("conv3d", 3)[1],),
    ("depthwise_conv2d",) + (_conv("depthwise_conv2d", 2)[1],),
    ("conv2d_transpose",) + (_conv("conv2d_transpose", 2, True)[1],),
    ("pool2d", lambda g, f: ((g.ftensor(f, ndim=g.pick([4, 4, 3])), g.ints(2, 0, 3)),
                             {"strides": g.ints(2, 0, 2), "padding": g.padding(),
                              "data_format": g.data_format(),
                              "pool_mode": g.pick(["max", "avg", "min"])})),
    ("pool3d", lambda g, f: ((g.ftensor(f, ndim=g.pick([5, 5, 4])), g.ints(3, 0, 2)),
                             {"strides": g.ints(3, 0, 2), "padding": g.padding(),
                              "pool_mode": g.pick(["max", "avg"])})),
    ("random_normal",) + (_random("random_normal", True)[1],),
    ("random_uniform",) + (_random("random_uniform", True)[1],),
    ("truncated_normal",) + (_random("truncated_normal", True)[1],),
    ("random_binomial",) + (_random("random_binomial", False)[1],),
    ("switch", lambda g, f: ((g.tensor(dtype=g.pick(["bool", "float32"]), feeds=f),
                              g.tensor(feeds=f), g.tensor(feeds=f)), {})),
    ("rnn", lambda g, f: ((_step, g.ftensor(f, ndim=g.pick([3, 3, 2])),
                           [g.ftensor(f, ndim=g.pick([2, 2, 1]))]),
                          {"unroll": g.pick([False, True]),
                           "go_backwards": g.pick([False, True])})),
    ("map_fn", lambda g, f: ((lambda x: x * 2, g.tensor(feeds=f)), {})),
    ("foldl", lambda g, f: ((lambda a, x: a + x, g.tensor(feeds=f)),
                            {"initializer": g.pick([None, 0.0])})),
    ("ctc_decode", lambda g, f: ((g.ftensor(f, ndim=g.pick([3, 3, 2])),
                                  g.tensor(dtype="int32", ndim=1, feeds=f)),
                                 {"greedy": g.pick([True, False]),
                                  "beam_width": g.pick([1, 3, 0]),
                                  "top_paths": g.pick([1, 2, 0])})),
    ("set_value", lambda g, f: ((K.variable(g.array(dtype=g.pick(FLOATS + ["int32"]))),
                                 g.pick([g.array(), None, "s", 1.5, [1, None]])), {})),
    ("count_params", lambda g, f: ((g.tensor(feeds=f),), {})),
    _unary("int_shape"), _unary("ndim"), _unary("size"),
    ("spatial_3d_padding", lambda g, f: ((g.tensor(feeds=f, ndim=g.pick([5, 5, 4])),
                                          (g.ints(2, -1, 2), g.ints(2, 0, 1), g.ints(2, 0, 1))),
                                         {"data_format": g.pick(["channels_last",
                                                                 "channels_first", None])})),
    ("resize_volumes", lambda g, f: ((g.tensor(feeds=f, ndim=g.pick([5, 5, 4])), g.count(),
                                      g.count(), g.count(),
                                      g.pick(["channels_last", "channels_first"])), {})),
    ("separable_conv2d", lambda g, f: (
        (g.ftensor(f, ndim=g.pick([4, 4, 3])), g.ftensor(f, ndim=4), g.ftensor(f, ndim=4)),
        {"strides": g.ints(2, 0, 2), "padding": g.padding(),
         "dilation_rate": g.ints(2, 0, 2)})),
    ("conv3d_transpose",) + (_conv("conv3d_transpose", 3, True)[1],),
    ("normalize_batch_in_training", lambda g, f: (
        (g.ftensor(f), g.ftensor(f), g.ftensor(f), g.pick([[0], [0, 1], [-1], [5], []])),
        {"epsilon": g.pick([1e-3, 0.0])})),
    ("foldr", lambda g, f: ((lambda a, x: a * x, g.tensor(feeds=f)),
                            {"initializer": g.pick([None, 1.0])})),
    ("in_train_phase", lambda g, f: ((g.tensor(feeds=f), g.tensor(feeds=f)),
                                     {"training": g.pick([None, 0, 1, True])})),
    ("pattern_broadcast", lambda g, f: ((g.tensor(feeds=f),
                                         [g.pick([True, False]) for _ in range(g.r.randint(4))]),
                                        {})),
    ("update_add", lambda g, f: ((K.variable(g.array(dtype=g.pick(FLOATS))), g.tensor(feeds=f)),
                                 {})),
    ("moving_average_update", lambda g, f: (
        (K.variable(g.array(dtype=g.pick(FLOATS))), g.tensor(feeds=f), g.scalar()), {})),
    ("random_uniform_variable", lambda g, f: ((g.shape(), g.scalar(), g.scalar()),
                                              {"dtype": g.pick(FLOATS + [None, "int32"]),
                                               "seed": g.pick([None, 2])})),
    ("local_conv1d", lambda g, f: ((g.ftensor(f, ndim=3), g.ftensor(f, ndim=3),
                                    g.pick([(1,), (2,), 1]), g.pick([(1,), (2,), 0])),
                                   {"data_format": g.pick(["channels_last", "channels_first"])})),
    ("ctc_batch_cost", lambda g, f: ((g.tensor(dtype="int32", ndim=2, feeds=f),
                                      g.ftensor(f, ndim=3),
                                      g.tensor(dtype="int32", ndim=2, feeds=f),
                                      g.tensor(dtype="int32", ndim=2, feeds=f)), {})),
    ("ctc_label_dense_to_sparse", lambda g, f: ((g.tensor(dtype="int32", ndim=2, feeds=f),
                                                 g.tensor(dtype="int32", ndim=1, feeds=f)), {})),
])


def _evaluate(out, feeds):
    """Run every tensor in ``out`` (a tensor or a nested list of them)."""
    flat, stack = [], [out]
    while stack:
        t = stack.pop()
        if isinstance(t, (list, tuple)):
            stack.extend(t)
        elif isinstance(t, Tensor):
            flat.append(t)
    if flat:
        phs = list(feeds)
        K.function(phs, flat)([feeds[p] for p in phs])


# Defects this fuzzer found that are not fixed yet (all outside the graph
# core: cyback/api/* and the shared helpers they call), as
# (function, exception type, start of the message). A failure matching one is
# counted as "known", not as a failure; anything else fails the test.
KNOWN = [
    # The message names a helper, not the function called.
    ("var", "TypeError", "mean: axis"), ("var", "ValueError", "mean: "),
    ("std", "TypeError", "mean: axis"), ("std", "ValueError", "mean: "),
    ("repeat", "TypeError", "tile: "), ("repeat", "ValueError", "tile: "),
    ("ctc_decode", "ValueError", "ctc_greedy_decode: "),
    # dtype_name / normalize_data_format raise without the caller's name.
    ("zeros", "TypeError", "unknown dtype"), ("ones", "TypeError", "unknown dtype"),
    ("eye", "TypeError", "unknown dtype"), ("cast", "TypeError", "unknown dtype"),
    ("arange", "TypeError", "unknown dtype"),
    ("bias_add", "ValueError", "The `data_format` argument"),
    ("resize_images", "ValueError", "The `data_format` argument"),
    ("spatial_2d_padding", "ValueError", "The `data_format` argument"),
    # Unchecked arguments failing inside.
    ("argmax", "TypeError", "'NoneType' object is not subscriptable"),
    ("cumsum", "TypeError", "'NoneType' object is not subscriptable"),
    ("clip", "TypeError", "'<' not supported"), ("clip", "UFuncTypeError", ""),
    ("pow", "TypeError", "data type 'str"),
    ("all", "AxisError", "axis 0 is out of bounds for array of dimension 0"),
    ("any", "AxisError", "axis 0 is out of bounds for array of dimension 0"),
    ("bias_add", "IndexError", "tuple index out of range"),
    # A negative Python number combined with an unsigned tensor.
    ("equal", "OverflowError", ""), ("not_equal", "OverflowError", ""),
    ("greater", "OverflowError", ""), ("greater_equal", "OverflowError", ""),
    ("less", "OverflowError", ""), ("less_equal", "OverflowError", ""),
    ("maximum", "OverflowError", ""), ("minimum", "OverflowError", ""),
    ("pow", "OverflowError", ""),
    # Run-time shape mismatches are named after the op, not the function.
    ("batch_normalization", "ValueError", "operands could not be broadcast"),
    ("categorical_crossentropy", "ValueError", "operands could not be broadcast"),
    ("batch_normalization", "ValueError", "subtract: shapes"),
    ("batch_normalization", "ValueError", "multiply: shapes"),
    ("batch_normalization", "ValueError", "add: shapes"),
    ("bias_add", "ValueError", "operands could not be broadcast"),
    ("ctc_decode", "ValueError", "ctc_beam_decode: "),
    ("stack", "ValueError", "all the input array dimensions"),
    ("conv1d", "ValueError", "conv_output_length: "),
    ("moving_average_update", "OverflowError", ""),
    ("normalize_batch_in_training", "ValueError", "reshape: "),
    ("normalize_batch_in_training", "ValueError", "subtract: shapes"),
    ("normalize_batch_in_training", "ValueError", "multiply: shapes"),
    ("normalize_batch_in_training", "ValueError", "add: shapes"),
    ("in_train_phase", "ValueError", "switch: "),
    ("in_train_phase", "ValueError", "operands could not be broadcast"),
    ("separable_conv2d", "ValueError", "conv_output_length: "),
    ("depthwise_conv2d", "ValueError", "conv_output_length: "),
    ("moving_average_update", "ValueError", "operands could not be broadcast"),
    ("update_add", "ValueError", "operands could not be broadcast"),
    ("normalize_batch_in_training", "ValueError", "operands could not be broadcast"),
    ("ctc_batch_cost", "ValueError", "ctc_loss: "),
    ("conv2d_transpose", "ValueError", "conv_output_length: "),
    ("conv3d_transpose", "ValueError", "conv_output_length: "),
    ("foldr", "IndexError", "index 0 is out of bounds for axis 0 with size 0"),
    # A time axis of unknown length fed with 0 steps.
    ("rnn", "IndexError", "index -1 is out of bounds for axis 0 with size 0"),
    ("foldl", "IndexError", "index 0 is out of bounds for axis 0 with size 0"),
]


def _known(name, why):
    kind, _, msg = why.partition(": ")
    return any(name == n and kind == k and msg.startswith(m) for n, k, m in KNOWN)


def call_once(name, gen):
    """Call ``name`` once with random arguments: 'ok', 'error' (a ValueError or
    TypeError naming the function) or 'bad: <what happened>'."""
    feeds = {}
    args, kwargs = SPECS[name](gen, feeds)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = getattr(K, name)(*args, **kwargs)
            _evaluate(out, feeds)
    except (ValueError, TypeError) as e:
        msg = str(e)
        if name in msg or name.replace("_", " ") in msg:
            return "error", None
        return "bad", "%s: %s" % (type(e).__name__, msg)
    except Exception as e:   # anything else is a failure
        return "bad", "%s: %s" % (type(e).__name__, e)
    return "ok", None


def run(calls, seed=0):
    """``calls`` random calls spread over every function; returns the counts
    {name: Counter(outcome)} and the failures [(name, seed, message)]."""
    names = sorted(SPECS)
    counts = collections.defaultdict(collections.Counter)
    failures = []
    for i in range(calls):
        name = names[i % len(names)]
        call_seed = seed * 1000003 + i
        outcome, why = call_once(name, Gen(call_seed))
        if why is not None and _known(name, why):
            outcome = "known"
        counts[name][outcome] += 1
        if outcome == "bad":
            failures.append((name, call_seed, why))
    return counts, failures


def _budget():
    return int(os.environ.get("CYBACK_FUZZ_CALLS", "600"))


def test_fuzz_api():
    counts, failures = run(_budget(), seed=int(os.environ.get("CYBACK_FUZZ_SEED", "0")))
    assert not failures, "\n".join("%s (Gen(%d)): %s" % f for f in failures[:30])
    # Every function ran; most calls must succeed, or the generators test nothing.
    assert set(counts) == set(SPECS)
    assert sum(c["ok"] for c in counts.values()) > 0.3 * sum(
        sum(c.values()) for c in counts.values())


# Regressions the fuzzer found and that are fixed.

def test_dot_with_an_empty_contracted_axis():
    for a, b in [((0, 0), (0, 0)), ((2, 0), (0, 3)), ((0, 3, 0), (0, 2))]:
        x, y = np.ones(a, "float32"), np.ones(b, "float32")
        out = K.eval(K.dot(K.constant(x), K.constant(y)))
        np.testing.assert_array_equal(out, np.zeros(a[:-1] + b[1:]))


def test_min_max_op_of_an_empty_bool_array():
    from cyback.ops.reduction import Reduce
    x = np.zeros((0, 3), bool)
    assert Reduce("max", (0,), False).compute(x)[0].tolist() == [False] * 3
    assert Reduce("min", None, True).compute(x)[0].tolist() == [[True]]


def test_every_spec_names_an_api_function():
    missing = [n for n in SPECS if not callable(getattr(K, n, None))]
    assert not missing


def main(argv):
    import argparse
    p = argparse.ArgumentParser(description="Fuzz the cyback API; prints outcome counts.")
    p.add_argument("--calls", type=int, default=_budget())
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    counts, failures = run(a.calls, a.seed)
    width = max(len(n) for n in counts)
    cols = ("ok", "error", "known", "bad")
    print("%-*s" % (width, "function") + "".join("%8s" % c for c in cols))
    total = collections.Counter()
    for name in sorted(counts):
        total.update(counts[name])
        print("%-*s" % (width, name) + "".join("%8d" % counts[name][c] for c in cols))
    print("%-*s" % (width, "total") + "".join("%8d" % total[c] for c in cols))
    by_kind = collections.Counter((n, why.split(":")[0]) for n, _, why in failures)
    for (n, kind), k in by_kind.most_common():
        example = next(f for f in failures if f[0] == n and f[2].startswith(kind))
        print("FAIL %s %s x%d, e.g. seed %d: %s" % (n, kind, k, example[1], example[2][:200]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
