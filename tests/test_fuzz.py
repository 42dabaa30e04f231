"""Fuzzing the backend API: every function called with random shapes (0 and 1
included), dtypes and argument values (huge sizes, floats and bools where
ints belong, strings, None), built and then evaluated. Each call must give a
result or raise a ValueError/TypeError whose message names the function;
anything else is a failure:

- "unclear": another exception (IndexError, MemoryError, an AxisError from
  NumPy, ...) or a message that does not name the function;
- "hang": a call still running after the per-call timeout (a SIGALRM
  interrupts it; one stuck in C code is caught by faulthandler's watchdog
  in the isolated long run, which records it and goes on);
- "crash": the interpreter died (isolated long run only).

Seeded. CI runs a short budget in-process (``CYBACK_FUZZ_CALLS``, default
600 calls, a few seconds). A long run goes through child processes that are
restarted after a crash or a hard hang, each on one thread under a memory
cap (a huge allocation fails at once instead of taking a shared machine's
memory; cyback's size bound follows the cap), and prints the outcome counts
per function, the totals and the time:

    CYBACK_FUZZ_CALLS=100000 python tests/test_fuzz.py [--seed S] [--jobs 2]

``--in-process`` runs the calls in this process instead; ``--replay NAME
SEED`` runs one call and shows its traceback.
"""
import collections
import faulthandler
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings

import numpy as np

import cyback as K
from cyback.graph.tensor import Tensor

DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8", "bool"]
FLOATS = ["float32", "float64"]
DIMS = [0, 1, 1, 2, 3, 4]
# what may come where an int belongs: huge (as sizes, an allocation no
# machine holds; as counts, an element count no index can reach), whole
# floats, bools, NumPy scalars, strings
ODD_INTS = [10 ** 9, 2 ** 31, 2 ** 62, 2 ** 70, -2 ** 63, 2.0, 1e9, True, False, np.int64(2),
            np.int32(3), np.uint8(1), np.float32(2.0), "3", None]


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
                          (0, 0), 1.5, "x", True, np.int64(-1), 1.0, 2 ** 63, -2 ** 40])

    def odd_int(self):
        return self.pick(ODD_INTS)

    def count(self):
        if self.chance(0.25):
            return self.odd_int()
        return self.pick([-1, 0, 1, 1, 2, 3, 2.5, None, True])

    def size_arg(self, lo=0, hi=3):
        """A shape given as an argument (zeros, random_normal, eye...): mostly
        small, sometimes with an odd entry, or not a shape at all."""
        shape = list(self.shape(lo=lo, hi=hi))
        if shape and self.chance(0.25):
            shape[self.r.randint(len(shape))] = self.odd_int()
        if self.chance(0.1):
            return self.pick([(-1,), 3, None, "x", np.array([2, 3]), np.array([2.0]),
                              (2 ** 40, 2 ** 40), [np.int64(2), 3]])
        return tuple(shape)

    def scalar(self):
        return self.pick([0.0, 1.0, -1.0, 0.5, 2, np.nan, np.inf, -1e30, None, "a",
                          np.float32(0.3), 10 ** 9, 1e300, np.int64(5), True, [1, 2],
                          np.array([1.0, 2.0])])

    def data_format(self):
        return self.pick(["channels_last", "channels_first", None, "NHWC", 3])

    def padding(self):
        return self.pick(["valid", "same", "causal", "full", None])

    def ints(self, n, lo=-1, hi=3):
        if self.chance(0.2):
            return self.pick([self.r.randint(lo, hi + 1), None, [1] * (n + 1), "2",
                              (self.odd_int(),) * n, self.odd_int()])
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
        a = g.size_arg() if not g.chance(0.2) else g.pick([(-1, 2), None, 3, "x"])
        extra = (g.scalar(), g.scalar()) if two else (g.pick([0.0, 0.5, 1.0, 2.0, -0.1, np.nan]),)
        return (a,) + extra, {"dtype": g.pick(FLOATS + [None, "int32"]), "seed": g.pick([None, 1])}
    return name, args


def _function_args(g, feeds, kwargs):
    outputs = [g.pick([g.tensor(feeds=feeds), 2.0, None, "s"]) for _ in range(g.r.randint(3))]
    inputs = [p for p in feeds if g.chance(0.9)]     # sometimes one is missing
    return (inputs, outputs), kwargs


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
    ("tile", lambda g, f: ((g.tensor(feeds=f), g.pick([2, (1, 2), [0, 1, 1], -1, (),
                                                        g.odd_int(), (1, g.odd_int())])), {})),
    ("reverse", lambda g, f: ((g.tensor(feeds=f), g.pick([0, -1, (0, 1), [], 5])), {})),
    ("slice", lambda g, f: ((g.tensor(feeds=f), g.ints(2, -1, 2), g.ints(2, -1, 2)), {})),
    ("gather", lambda g, f: ((g.tensor(feeds=f),
                              g.tensor(dtype=g.pick(["int32", "int64", "float32"]), feeds=f)),
                             {})),
    ("one_hot", lambda g, f: ((g.tensor(dtype=g.pick(["int32", "int64", "float32"]), feeds=f),
                               g.count()), {})),
    ("arange", lambda g, f: ((g.pick([0, 3, -2, 2.5, 10 ** 12]),
                              g.pick([None, 5, 0, -3, 10 ** 12, 2 ** 62, 1e300, np.inf])),
                             {"step": g.pick([1, 2, -1, 0, 0.5, 1e-300, np.nan]),
                              "dtype": g.pick(["int32", "float32", "bool", "x"])})),
    ("eye", lambda g, f: ((g.pick([0, 1, 3, -1, (2, 3), 2.5, g.odd_int(),
                                   (3, g.odd_int())]),), {"dtype": g.dtype()})),
    ("zeros", lambda g, f: ((g.size_arg(),), {"dtype": g.dtype()})),
    ("ones", lambda g, f: ((g.size_arg(),), {"dtype": g.dtype()})),
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
    ("random_uniform_variable", lambda g, f: ((g.size_arg(), g.scalar(), g.scalar()),
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
    # leaves, values and functions
    ("constant", lambda g, f: ((g.pick([g.array(), 1.5, [1, 2], "a", None]),),
                               {"dtype": g.dtype(), "shape": g.pick([None, None, g.size_arg()])})),
    ("placeholder", lambda g, f: ((), {"shape": g.pick([None, g.size_arg(), (None, 3)]),
                                       "ndim": g.pick([None, 2, g.odd_int(), -1]),
                                       "dtype": g.dtype(), "sparse": g.pick([False, True])})),
    ("variable", lambda g, f: ((g.pick([g.array(), 2.0, [[1, 2], [3]], "s", None,
                                        g.tensor(feeds=None)]),),
                               {"dtype": g.pick([None, g.dtype()])})),
    ("eval", lambda g, f: ((g.pick([g.tensor(), K.variable(g.array()), g.array(), "s"]),), {})),
    ("get_value", lambda g, f: ((g.pick([K.variable(g.array()), g.tensor(), g.array()]),), {})),
    ("batch_get_value", lambda g, f: (([K.variable(g.array()) for _ in range(g.r.randint(3))],),
                                      {})),
    ("batch_set_value", lambda g, f: (([(K.variable(g.array(dtype=g.pick(FLOATS))),
                                         g.pick([g.array(), None, "s", 1.5]))
                                        for _ in range(g.r.randint(3))],), {})),
    ("update", lambda g, f: ((K.variable(g.array(dtype=g.pick(FLOATS))), g.tensor(feeds=f)), {})),
    ("update_sub", lambda g, f: ((K.variable(g.array(dtype=g.pick(FLOATS))), g.tensor(feeds=f)),
                                 {})),
    ("print_tensor", lambda g, f: ((g.tensor(feeds=f), g.pick(["", "x = ", 3])), {})),
    ("gradients", lambda g, f: ((g.pick([g.ftensor(f), g.tensor(feeds=f)]),
                                 g.pick([[g.ftensor(f)], [], g.ftensor(f), [None], "x"])), {})),
    ("in_test_phase", lambda g, f: ((g.tensor(feeds=f), g.tensor(feeds=f)),
                                    {"training": g.pick([None, 0, 1, True, 2, "x"])})),
    ("local_conv2d", lambda g, f: ((g.ftensor(f, ndim=4), g.ftensor(f, ndim=3),
                                    g.ints(2, 0, 2), g.ints(2, 0, 2), g.ints(2, 0, 2)),
                                   {"data_format": g.pick(["channels_last", "channels_first"])})),
    ("separable_conv1d", lambda g, f: (
        (g.ftensor(f, ndim=g.pick([3, 3, 2])), g.ftensor(f, ndim=3), g.ftensor(f, ndim=3)),
        {"strides": g.pick([1, 2, 0, g.odd_int()]), "padding": g.padding(),
         "dilation_rate": g.pick([1, 2, 0])})),
    ("random_normal_variable", lambda g, f: ((g.size_arg(), g.scalar(), g.scalar()),
                                             {"dtype": g.pick(FLOATS + [None, "int32"]),
                                              "seed": g.pick([None, 2, -1, 1.5])})),
    ("to_dense", lambda g, f: ((g.pick([g.tensor(feeds=f), g.array()]),), {})),
    ("is_variable", lambda g, f: ((g.pick([g.tensor(feeds=f), g.array(), None]),), {})),
    ("is_tensor", lambda g, f: ((g.pick([g.tensor(feeds=f), g.array(), None]),), {})),
    ("is_placeholder", lambda g, f: ((g.pick([g.tensor(feeds=f), g.array(), None]),), {})),
    ("is_sparse", lambda g, f: ((g.pick([g.tensor(feeds=f), g.array(), None]),), {})),
    ("is_symbolic", lambda g, f: ((g.pick([g.tensor(feeds=f), g.array(), None]),), {})),
    ("is_keras_tensor", lambda g, f: ((g.pick([g.tensor(feeds=f), g.array(), None]),), {})),
    ("dtype", lambda g, f: ((g.pick([g.tensor(feeds=f), g.array(), 3]),), {})),
    ("get_variable_shape", lambda g, f: ((g.pick([g.tensor(feeds=f), g.array()]),), {})),
    ("function", lambda g, f: _function_args(g, f, {"updates": g.pick(
        [None, [], ["s"], [(K.variable(g.array()),)]])})),
    ("Function", lambda g, f: _function_args(g, f, {"name": g.pick([None, "f", 3])})),
    ("control_dependencies", lambda g, f: ((g.pick([None, [], [g.tensor(feeds=f)], 3]),), {})),
    ("symbolic", lambda g, f: ((lambda: None,), {})),
    ("eager", lambda g, f: ((lambda: None,), {})),
    ("get_graph", lambda g, f: ((), {})),
    ("get_session", lambda g, f: ((), {})),
    ("resize_half_pixel_centers", lambda g, f: ((), {})),
])

# Functions left out, each for a reason: they change process-wide settings
# that other calls would then see.
NOT_FUZZED = {
    "clear_session": "resets the uids, the learning phase and the caches",
    "manual_variable_initialization": "a process-wide Keras setting",
    "set_session": "replaces the session every get_session returns",
    "set_resize_half_pixel_centers": "changes how later bilinear resizes sample",
}


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


class CallTimeout(BaseException):
    """Raised by SIGALRM in the main thread when a call runs past its time
    (a BaseException, so that no ``except Exception`` in the code under test
    swallows it)."""


def _on_alarm(signum, frame):
    raise CallTimeout()


class _Deadlines(object):
    """Per-call time limits: SIGALRM interrupts a call after ``seconds`` (in
    the main thread, where signals arrive), and faulthandler's watchdog,
    which needs no GIL, dumps the tracebacks and ends the process after
    ``hard`` seconds if the call is stuck in C code meanwhile."""

    def __init__(self, seconds, hard, hard_file=None):
        self.seconds, self.hard = seconds, hard
        self.hard_file = hard_file if hard_file is not None else sys.stderr
        self.alarm = bool(seconds) and hasattr(signal, "setitimer") and \
            threading.current_thread() is threading.main_thread()
        self.previous = None

    def __enter__(self):
        if self.alarm:
            self.previous = signal.signal(signal.SIGALRM, _on_alarm)
        return self

    def __exit__(self, *exc):
        if self.alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)
        if self.hard:
            faulthandler.cancel_dump_traceback_later()

    def start(self):
        if self.hard:
            faulthandler.dump_traceback_later(self.hard, exit=True, file=self.hard_file)
        if self.alarm:
            signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def stop(self):
        if self.alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if self.hard:
            faulthandler.cancel_dump_traceback_later()


_NO_LIMITS = _Deadlines(0, 0)


def _names_function(name, msg):
    name = name.lower()     # Function's errors say "function"
    return name in msg or name.replace("_", " ") in msg


def call_once(name, gen, limits=_NO_LIMITS):
    """Call ``name`` once with random arguments: ``(outcome, why)`` with
    outcome 'ok', 'error' (a ValueError or TypeError naming the function),
    'unclear' or 'hang'; ``why`` describes the last two."""
    feeds = {}
    args, kwargs = SPECS[name](gen, feeds)
    try:
        limits.start()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = getattr(K, name)(*args, **kwargs)
                _evaluate(out, feeds)
        finally:
            limits.stop()
    except CallTimeout:
        return "hang", "no result after %gs" % limits.seconds
    except (ValueError, TypeError) as e:
        if _names_function(name, str(e)):
            return "error", None
        return "unclear", "%s: %s" % (type(e).__name__, e)
    except Exception as e:   # anything else leaked out
        return "unclear", "%s: %s" % (type(e).__name__, e)
    return "ok", None


OUTCOMES = ("ok", "error", "unclear", "hang", "crash")


def call_seed(seed, i):
    return seed * 1000003 + i


def _name_of_call(i):
    names = sorted(SPECS)
    return names[i % len(names)]


def run(calls, seed=0, timeout=0, hard=0, start=0, log=None, hard_file=None, inject=None):
    """Calls ``start`` .. ``calls - 1`` spread over every function; returns
    the counts {name: Counter(outcome)} and the failures [(name, seed,
    outcome, why)]. ``log``: a file that gets a line before each call and one
    with its outcome after it (the isolated run reads it when a child dies).
    ``inject``: {call index: "crash" or "hang"}, faults to make there (to
    test the harness)."""
    counts = collections.defaultdict(collections.Counter)
    failures = []
    with _Deadlines(timeout, hard, hard_file) as limits:
        for i in range(start, calls):
            name, s = _name_of_call(i), call_seed(seed, i)
            if log is not None:
                log.write("> %d\n" % i)
                log.flush()
            if inject and i in inject:
                _fault(inject[i], limits)
            outcome, why = call_once(name, Gen(s), limits)
            counts[name][outcome] += 1
            if why is not None:
                failures.append((name, s, outcome, why))
            if log is not None:
                log.write(json.dumps([i, name, outcome, why]) + "\n")
    return counts, failures


# ------------------------------------------------------------ the long run

def _child_env(workdir):
    env = dict(os.environ)
    # one thread each: the long run shares the machine
    env.update(CYBACK_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONSAFEPATH="1")
    env.setdefault("KERAS_HOME", workdir)
    return env


def _run_chunk(start, stop, seed, timeout, max_gib, workdir, counts, failures):
    """Calls [start, stop) in child processes, a new one after each crash or
    hard hang, adding to ``counts`` and ``failures``."""
    env = _child_env(workdir)
    log = os.path.join(workdir, "log-%d" % start)
    dump = os.path.join(workdir, "dump-%d" % start)
    while start < stop:
        for path in (log, dump):
            if os.path.exists(path):
                os.remove(path)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--start", str(start),
               "--stop", str(stop), "--seed", str(seed), "--timeout", str(timeout),
               "--max-gib", str(max_gib), "--log", log, "--dump", dump]
        child = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
        if not os.path.exists(log):
            # dead before its first call: the harness, not a call, failed
            raise RuntimeError("fuzz: a child could not start (exit status %d): %s"
                               % (child.returncode, child.stderr.decode(errors="replace")))
        running, resume = None, start    # the call without an outcome, the next one
        with open(log) as f:
            for line in f:
                if line.startswith(">"):
                    running = int(line[1:])
                    continue
                try:
                    i, name, outcome, why = json.loads(line)
                except ValueError:      # a line cut short by the child's death
                    continue
                counts[name][outcome] += 1
                if why is not None:
                    failures.append((name, call_seed(seed, i), outcome, why))
                running, resume = None, i + 1
        if child.returncode == 0:
            return
        with open(dump) as f:
            hung = "Timeout" in f.read()
        outcome = "hang" if hung else "crash"
        why = "no result after %gs, stuck outside Python" % (3 * timeout) if hung else \
            "the interpreter died (exit status %d): %s" % (
                child.returncode, child.stderr.decode(errors="replace")[-300:])
        if running is None:
            # died between two calls: charged to the harness, not to a call
            raise RuntimeError("fuzz: a child died after call %d: %s" % (resume - 1, why))
        name = _name_of_call(running)
        counts[name][outcome] += 1
        failures.append((name, call_seed(seed, running), outcome, why))
        start = running + 1


def run_isolated(calls, seed=0, timeout=30.0, max_gib=4, jobs=1, chunk=2000):
    """``run`` through child processes (see the module docstring), ``jobs``
    at a time."""
    counts = collections.defaultdict(collections.Counter)
    failures = []
    pending = [(a, min(a + chunk, calls)) for a in range(0, calls, chunk)][::-1]
    lock = threading.Lock()

    errors = []

    def worker():
        with tempfile.TemporaryDirectory(prefix="cyback-fuzz-") as workdir:
            work(workdir)

    def work(workdir):
        while True:
            with lock:
                if not pending or errors:
                    return
                a, b = pending.pop()
            c, f = collections.defaultdict(collections.Counter), []
            try:
                _run_chunk(a, b, seed, timeout, max_gib, workdir, c, f)
            except Exception as e:
                errors.append(e)
                return
            with lock:
                for n, x in c.items():
                    counts[n].update(x)
                failures.extend(f)
                sys.stderr.write("fuzz: calls %d-%d done, %d failures so far\n"
                                 % (a, b - 1, len(failures)))

    threads = [threading.Thread(target=worker) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return counts, sorted(failures, key=lambda f: f[1])


def _fault(kind, limits):
    limits.start()
    if kind == "crash":
        os.abort()
    # stuck where SIGALRM cannot reach: only the watchdog ends it
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
    time.sleep(10 * (limits.hard or 1))


def _injected():
    """Faults to make, from CYBACK_FUZZ_INJECT ("crash@5,hang@9"): only for
    the harness's own test."""
    spec = os.environ.get("CYBACK_FUZZ_INJECT", "")
    return {int(i): kind for kind, _, i in (p.partition("@") for p in spec.split(",") if p)}


def _child(a):
    """One child of the isolated run."""
    if a.max_gib:
        import resource
        limit = int(a.max_gib * 2 ** 30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with open(a.log, "w") as log, open(a.dump, "w") as dump:
        run(a.stop, a.seed, timeout=a.timeout, hard=3 * a.timeout, start=a.start, log=log,
            hard_file=dump, inject=_injected())
    return 0


def _budget():
    return int(os.environ.get("CYBACK_FUZZ_CALLS", "600"))


def _seed():
    return int(os.environ.get("CYBACK_FUZZ_SEED", "0"))


class _AddressSpaceCap(object):
    """``with _AddressSpaceCap(gib):`` lowers this process's address-space
    limit to its present size plus ``gib`` GiB, and puts the old limit back
    after: an allocation too large for that fails at once (cyback checks
    sizes against the limit, graph/limits.py) instead of taking the
    machine's memory. Does nothing where RLIMIT_AS or /proc is missing."""

    def __init__(self, gib):
        self.gib = gib
        self.saved = None

    def __enter__(self):
        try:
            import resource
            with open("/proc/self/status") as f:
                size = int(f.read().split("VmSize:")[1].split()[0]) * 1024
        except (ImportError, OSError, IndexError, ValueError):
            return self
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = size + int(self.gib * 2 ** 30)
        if soft == resource.RLIM_INFINITY or cap < soft:
            if hard != resource.RLIM_INFINITY:
                cap = min(cap, hard)
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
            self.saved = (soft, hard)
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            import resource
            resource.setrlimit(resource.RLIMIT_AS, self.saved)


def test_fuzz_api():
    # In-process, as CI runs it, under a memory cap; a call stuck in C code
    # past 10 minutes ends the process with its traceback rather than
    # hanging the job.
    with _AddressSpaceCap(4):
        counts, failures = run(_budget(), seed=_seed(), timeout=60, hard=600)
    assert not failures, "\n".join("%s (Gen(%d)) %s: %s" % f for f in failures[:30])
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


def test_the_long_run_counts_crashes_and_hangs_and_goes_on(monkeypatch):
    # A child that dies, and one stuck where no signal reaches it, are
    # counted against the call they were running; the other calls still run.
    monkeypatch.setenv("CYBACK_FUZZ_INJECT", "crash@3,hang@7")
    counts, failures = run_isolated(12, seed=0, timeout=1.0, max_gib=0, chunk=12)
    assert sum(sum(c.values()) for c in counts.values()) == 12
    kinds = {(f[0], f[2]) for f in failures if f[2] in ("crash", "hang")}
    assert kinds == {(_name_of_call(3), "crash"), (_name_of_call(7), "hang")}
    assert sum(c["crash"] for c in counts.values()) == 1
    assert sum(c["hang"] for c in counts.values()) == 1


def test_a_call_past_its_time_is_a_hang(monkeypatch):
    monkeypatch.setitem(SPECS, "_slow", lambda g, feeds: ((), {}))
    monkeypatch.setattr(K, "_slow", lambda: time.sleep(5), raising=False)
    with _Deadlines(0.2, 0) as limits:
        outcome, why = call_once("_slow", Gen(0), limits)
    assert outcome == "hang"


def test_every_spec_names_an_api_function():
    missing = [n for n in SPECS if not callable(getattr(K, n, None))]
    assert not missing


def test_every_api_function_is_fuzzed_or_left_out_for_a_reason():
    import importlib
    names = set()
    for module in ("core", "math", "manip", "nn", "conv", "random", "rnn", "control", "ctc"):
        names.update(importlib.import_module("cyback.api." + module).__all__)
    assert not set(SPECS) & set(NOT_FUZZED)
    assert sorted(names - set(SPECS) - set(NOT_FUZZED)) == []


def _replay(name, seed):
    """Run one call as the fuzzer made it, letting its exception through."""
    feeds = {}
    args, kwargs = SPECS[name](Gen(seed), feeds)
    print("%s(*%r, **%r)" % (name, args, kwargs))
    out = getattr(K, name)(*args, **kwargs)
    _evaluate(out, feeds)
    print("ok")
    return 0


def main(argv):
    import argparse
    p = argparse.ArgumentParser(description="Fuzz the cyback API; prints outcome counts.")
    p.add_argument("--calls", type=int, default=_budget())
    p.add_argument("--seed", type=int, default=_seed())
    # A call may make the largest array the cap allows (cyback's bound is half
    # of what is left) and copy it once or twice: seconds on a loaded machine.
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds a call may take (three times that stuck in C code)")
    p.add_argument("--max-gib", type=float, default=4.0,
                   help="address-space cap of each child process, GiB (0: none)")
    p.add_argument("--jobs", type=int, default=1, help="child processes at a time")
    p.add_argument("--in-process", action="store_true")
    p.add_argument("--replay", nargs=2, metavar=("NAME", "SEED"))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--stop", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--log", help=argparse.SUPPRESS)
    p.add_argument("--dump", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        return _child(a)
    if a.replay:
        return _replay(a.replay[0], int(a.replay[1]))
    began = time.time()
    if a.in_process:
        with _AddressSpaceCap(a.max_gib):
            counts, failures = run(a.calls, a.seed, timeout=a.timeout, hard=3 * a.timeout)
    else:
        counts, failures = run_isolated(a.calls, a.seed, a.timeout, a.max_gib, a.jobs)
    elapsed = time.time() - began
    width = max(len(n) for n in counts)
    print("%-*s" % (width, "function") + "".join("%8s" % c for c in OUTCOMES))
    total = collections.Counter()
    for name in sorted(counts):
        total.update(counts[name])
        print("%-*s" % (width, name) + "".join("%8d" % counts[name][c] for c in OUTCOMES))
    print("%-*s" % (width, "total") + "".join("%8d" % total[c] for c in OUTCOMES))
    print("%d calls (seed %d) in %.0f s: %d crashes, %d hangs, %d unclear errors"
          % (sum(total.values()), a.seed, elapsed, total["crash"], total["hang"],
             total["unclear"]))
    kinds = collections.OrderedDict()
    for name, seed, outcome, why in failures:
        kinds.setdefault((name, outcome, why.split(":")[0]), []).append((seed, why))
    for (name, outcome, kind), seen in kinds.items():
        print("FAIL %s %s %s x%d, e.g. --replay %s %d: %s"
              % (name, outcome, kind, len(seen), name, seen[0][0], seen[0][1][:200]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
