"""The plan optimizer through the public API: K.function with the optimizer
on against the same graph with it off (``K.set_graph_optimizer(False)``).

Element-wise chains are fused (cyback/graph/fusion.py), BatchNorm is folded
into the conv / depthwise / dense before it at inference
(cyback/graph/optimize.py), weight-only steps of inference plans are computed
once and refolded when a variable changes (cyback/graph/frozen.py), and
training plans keep values bit-identical to the graph as written.
"""
import os
import subprocess
import sys
import threading
import zlib

import numpy as np
import pytest

import cyback as K
from cyback.kernels import conv as conv_kernels
from cyback.kernels import runtime
from cyback.ops import elementwise as ew_ops


@pytest.fixture(autouse=True)
def _optimizer_on():
    K.set_graph_optimizer(True)
    yield
    K.set_graph_optimizer(True)


def _run(inputs, outputs, feeds, optimize, updates=None):
    """(function, results) for a function built and called with the
    optimizer ``optimize`` (its plan is made for the state at call time)."""
    K.set_graph_optimizer(optimize)
    try:
        f = K.function(inputs, outputs, updates=updates)
        return f, f(feeds)
    finally:
        K.set_graph_optimizer(True)


def _steps(f, optimize=True):
    K.set_graph_optimizer(optimize)
    try:
        return [repr(op) for op in f.plan_ops(0)]
    finally:
        K.set_graph_optimizer(True)


def _compare(inputs, outputs, feeds, rtol=1e-5, exact=False, more_feeds=()):
    """Results with the optimizer on and off agree (for ``feeds`` and each
    of ``more_feeds``); returns the optimized function and its results for
    ``feeds``."""
    fs = {}
    for opt in (False, True):
        K.set_graph_optimizer(opt)
        fs[opt] = K.function(inputs, outputs)
    K.set_graph_optimizer(True)
    first = None
    for fd in [feeds] + list(more_feeds):
        K.set_graph_optimizer(False)
        want = fs[False](fd)
        K.set_graph_optimizer(True)
        got = fs[True](fd)
        first = got if first is None else first
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            if exact:
                np.testing.assert_array_equal(g, w)
            else:
                scale = max(1.0, float(np.max(np.abs(w)))) if w.size else 1.0
                np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale)
    return fs[True], first


# ------------------------------------------------------------------ switch

def test_switch_validates_and_reports():
    assert K.graph_optimizer() is True
    for bad in ("yes", 1, None, np.bool_(True)):
        with pytest.raises(TypeError, match="set_graph_optimizer"):
            K.set_graph_optimizer(bad)
    K.set_graph_optimizer(False)
    assert K.graph_optimizer() is False


def test_existing_function_follows_the_switch():
    x = K.placeholder((None, 4))
    f = K.function([x], [K.relu(x * 2.0 + 1.0)])
    X = np.arange(8, dtype=np.float32).reshape(2, 4) - 4
    want = np.maximum(X * 2 + 1, 0)
    np.testing.assert_array_equal(f([X])[0], want)
    fused = _steps(f, True)
    plain = _steps(f, False)
    assert len(fused) == 1 and fused[0].startswith("Fused")
    assert len(plain) == 3
    K.set_graph_optimizer(False)
    np.testing.assert_array_equal(f([X])[0], want)
    K.set_graph_optimizer(True)
    np.testing.assert_array_equal(f([X])[0], want)


_ENV_SRC = """
import numpy as np, cyback as K
print(K.graph_optimizer())
x = K.placeholder((None, 3))
f = K.function([x], [K.relu(x * 2.0 + 1.0)])
print(len(f.plan_ops(0)))
"""


def _python_with_env(value):
    # the child imports the cyback under test
    root = os.path.dirname(os.path.dirname(os.path.abspath(K.__file__)))
    path = os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env = dict(os.environ, CYBACK_OPTIMIZE=value, PYTHONPATH=path)
    return subprocess.run([sys.executable, "-c", _ENV_SRC], env=env, capture_output=True,
                          text=True, timeout=120)


def test_env_switch_off_and_bad_value():
    r = _python_with_env("0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "3"]
    r = _python_with_env("abc")          # warns and keeps the default: on
    assert r.returncode == 0, r.stderr
    assert "ConfigWarning" in r.stderr and "CYBACK_OPTIMIZE must be 0 or 1" in r.stderr
    assert r.stdout.split()[0] == "True"


# ------------------------------------------------------------------ element-wise chains

# relu with a threshold and elu emit select_gt(x, ., x, .) with x twice (a
# register read twice by one instruction: test_repeated_source_register_is_
# freed_once and test_random_chains_with_repeated_sources keep that case hot)
DUPLICATE_SOURCE_UNARY = ["relu_thr", "elu", "elu2"]
EXACT_UNARY = ["relu", "relu_alpha", "relu6", "relu_all", "clip", "hard_sigmoid", "abs",
               "square", "sqrt", "neg", "relu_thr"]
TRANS_UNARY = ["tanh", "sigmoid", "softplus", "elu", "elu2"]
BINARY = ["add", "sub", "mul", "div", "max", "min"]


def _apply_unary(name, t):
    if name == "relu":
        return K.relu(t)
    if name == "relu_alpha":
        return K.relu(t, alpha=0.3)
    if name == "relu6":
        return K.relu(t, max_value=6.0)
    if name == "relu_thr":
        return K.relu(t, threshold=0.25)
    if name == "relu_all":
        return K.relu(t, alpha=0.1, max_value=2.5, threshold=-0.5)
    if name == "clip":
        return K.clip(t, -0.7, 1.3)
    if name == "hard_sigmoid":
        return K.hard_sigmoid(t)
    if name == "abs":
        return K.abs(t)
    if name == "square":
        return K.square(t) * 0.25
    if name == "sqrt":
        return K.sqrt(K.abs(t) + 0.5)      # of positives
    if name == "neg":
        return -t
    if name == "elu":
        return K.elu(t)
    if name == "elu2":
        return K.elu(t, alpha=0.5)
    if name == "tanh":
        return K.tanh(t)
    if name == "sigmoid":
        return K.sigmoid(t)
    if name == "softplus":
        return K.softplus(t)
    raise AssertionError(name)


def _apply_binary(name, t, u):
    if name == "add":
        return t + u
    if name == "sub":
        return t - u
    if name == "mul":
        return t * u
    if name == "div":
        return t / (K.abs(u) + 1.0)
    if name == "max":
        return K.maximum(t, u)
    if name == "min":
        return K.minimum(t, u)
    raise AssertionError(name)


def _chain(rng, x, extra, layout, dtype, n_ops, exact, more_unary=()):
    """A random element-wise chain on x; ``extra`` is a second full-size
    input. Operands: full, per-channel (variables and constants, in the
    layout's shape) and scalar."""
    C = 3
    if layout == "last":
        chan_shapes = [(C,), (1, 1, 1, C)]
    else:
        chan_shapes = [(C, 1, 1), (1, C, 1, 1)]
    unary = (EXACT_UNARY if exact else EXACT_UNARY + TRANS_UNARY) + list(more_unary)
    t = x
    for _ in range(n_ops):
        if rng.random() < 0.45:
            t = _apply_unary(unary[rng.integers(len(unary))], t)
            continue
        kind = rng.integers(5)
        if kind == 0:
            u = extra
        elif kind == 1:
            u = x
        elif kind == 2:
            shape = chan_shapes[rng.integers(len(chan_shapes))]
            u = K.variable(rng.standard_normal(shape), dtype=dtype)
        elif kind == 3:
            shape = chan_shapes[rng.integers(len(chan_shapes))]
            u = K.constant(rng.standard_normal(shape), dtype=dtype)
        else:
            u = float(np.round(rng.standard_normal(), 3))
        name = BINARY[rng.integers(len(BINARY))]
        t = _apply_binary(name, t, u) if rng.random() < 0.7 or not isinstance(u, float) \
            else _apply_binary(name, K.constant(u, dtype=dtype), t)
    return t


def _feed(rng, shape, dtype, noncontiguous):
    if not noncontiguous:
        return rng.standard_normal(shape).astype(dtype)
    # a transposed array: same values, not C-contiguous
    return rng.standard_normal(shape[::-1]).astype(dtype).T


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout", ["last", "first"])
@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("seed", range(2))
def test_random_chains_match_the_unoptimized_plan(seed, exact, layout, dtype):
    rng = np.random.default_rng(1000 * seed + 10 * exact + (layout == "first"))
    spatial = (4, 5, 3) if layout == "last" else (3, 4, 5)
    x = K.placeholder((None,) + spatial, dtype=dtype)
    e = K.placeholder((None,) + spatial, dtype=dtype)
    ys = [_chain(rng, x, e, layout, dtype, int(rng.integers(3, 9)), exact) for _ in range(2)]
    fs = {}
    for opt in (False, True):
        K.set_graph_optimizer(opt)
        fs[opt] = K.function([x, e], ys)
    K.set_graph_optimizer(True)
    assert any("Fused" in s for s in _steps(fs[True]))
    for batch, nc in ((0, False), (1, False), (5, False), (5, True), (2, True)):
        feeds = [_feed(rng, (batch,) + spatial, dtype, nc), _feed(rng, (batch,) + spatial,
                                                                   dtype, not nc)]
        kept = [a.copy() for a in feeds]
        K.set_graph_optimizer(False)
        want = fs[False](feeds)
        K.set_graph_optimizer(True)
        got = fs[True](feeds)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            if exact:
                np.testing.assert_array_equal(g, w)
            else:
                np.testing.assert_allclose(g, w, rtol=1e-5 if dtype == "float32" else 1e-12,
                                           atol=1e-6 if dtype == "float32" else 1e-13)
        for a, b in zip(feeds, kept):       # fused steps never write into a feed
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", ["elu", "relu_threshold"])
def test_repeated_source_register_is_freed_once(case):
    x = K.placeholder((None, 3))
    e = K.placeholder((None, 3))
    if case == "elu":
        y = K.elu(x + e) - K.abs(e) * K.square(e)
    else:
        y = (K.relu(x + e, threshold=0.5) + e) / (K.abs(e) + 1.0)
    rng = np.random.default_rng(1)
    feeds = [rng.standard_normal((2, 3)).astype("float32") for _ in range(2)]
    f, _ = _compare([x, e], [y], feeds, rtol=1e-6)
    assert len(_steps(f)) == 1


def test_reciprocal_of_abs_at_zero():
    x = K.placeholder((None, 3))
    X = np.array([[0.0, -0.0, 2.0]], "float32")
    with np.errstate(divide="ignore"):
        f, got = _compare([x], [1.0 / K.abs(x)], [X], exact=True)
    assert _steps(f)[0].startswith("Fused")
    np.testing.assert_array_equal(got[0], [[np.inf, np.inf, 0.5]])


def test_random_chains_with_repeated_sources():
    # seeds 10 and 24 built chains that overwrote a live register before the
    # fix; every seed here must now match
    for seed in range(30):
        rng = np.random.default_rng(seed)
        x = K.placeholder((None, 4, 5, 3))
        e = K.placeholder((None, 4, 5, 3))
        ys = [_chain(rng, x, e, "last", "float32", 8, False, DUPLICATE_SOURCE_UNARY)
              for _ in range(2)]
        feeds = [rng.standard_normal((3, 4, 5, 3)).astype("float32") for _ in range(2)]
        _compare([x, e], ys, feeds)


def test_chain_with_feeds_of_another_float_dtype():
    x = K.placeholder((None, 3), dtype="float32")
    X = np.linspace(-2, 2, 12).reshape(4, 3)      # float64 fed to float32
    _compare([x], [K.relu(x * 3.0 - 1.0, max_value=2.0)], [X], exact=True)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_batch_that_broadcasts_at_run_time_falls_back(dtype):
    a = K.placeholder((None, 4), dtype=dtype)
    b = K.placeholder((None, 4), dtype=dtype)
    c = K.variable(np.array([1.0, -2.0, 0.5, 3.0]), dtype=dtype)
    y = K.relu(a * 2.0 + b * c - 0.5, alpha=0.1)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((1, 4)).astype(dtype)
    B = rng.standard_normal((3, 4)).astype(dtype)
    f, _ = _compare([a, b], [y], [A, B], exact=True)
    assert any("Fused" in s for s in _steps(f))

    def ref(A, B):
        t = A * 2 + B * K.get_value(c) - 0.5
        return np.maximum(t, 0) - 0.1 * np.maximum(-t, 0)

    for P, Q in ((A, B), (B, A), (B, B), (A, A)):
        got = f([P, Q])[0]
        assert got.shape == np.broadcast_shapes(P.shape, Q.shape)
        np.testing.assert_allclose(got, ref(P, Q), rtol=1e-6)


# ------------------------------------------------------------------ BatchNorm folding

def _bn_params(rng, c, dtype):
    mean = K.variable(rng.standard_normal(c), dtype=dtype)
    var = K.variable(rng.uniform(0.3, 3.0, c), dtype=dtype)
    beta = K.variable(rng.standard_normal(c), dtype=dtype)
    gamma = K.variable(rng.uniform(0.5, 2.0, c) * rng.choice([-1, 1], c), dtype=dtype)
    return mean, var, beta, gamma


def _layer(kind, rng, x, fmt, dtype, bias):
    """(output, number of output channels) of a conv-like layer on x."""
    def k(*shape):
        return K.variable(rng.standard_normal(shape) * 0.5, dtype=dtype)

    if kind == "conv2d":
        y, c = K.conv2d(x, k(3, 3, 3, 4), padding="same", data_format=fmt), 4
    elif kind == "depthwise":
        y, c = K.depthwise_conv2d(x, k(3, 3, 3, 2), data_format=fmt), 6
    elif kind == "separable":
        y, c = K.separable_conv2d(x, k(3, 3, 3, 2), k(1, 1, 6, 5), padding="same",
                                  data_format=fmt), 5
    elif kind == "conv1d":
        y, c = K.conv1d(x, k(3, 3, 4), padding="causal", data_format=fmt), 4
    else:
        y, c = K.dot(x, k(3, 4)), 4
    if bias:
        y = K.bias_add(y, K.variable(rng.standard_normal(c), dtype=dtype), data_format=fmt)
    return y, c


_INPUTS = {"conv2d": (6, 5), "depthwise": (6, 5), "separable": (6, 5), "conv1d": (7,),
           "dense": ()}


@pytest.mark.parametrize("bias,act", [(True, "relu6"), (False, "relu"), (True, None)])
@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
@pytest.mark.parametrize("kind", ["conv2d", "depthwise", "separable", "conv1d", "dense"])
def test_batchnorm_folds_into_the_layer_before(kind, fmt, bias, act):
    if kind == "dense" and fmt == "channels_first":
        pytest.skip("dense has no data format")
    dtype = "float32"
    rng = np.random.default_rng(zlib.crc32(repr((kind, fmt, bias, act)).encode()))
    spatial = _INPUTS[kind]
    cl = fmt == "channels_last"
    shape = (None,) + (spatial + (3,) if cl else (3,) + spatial)
    x = K.placeholder(shape, dtype=dtype)
    y, c = _layer(kind, rng, x, fmt, dtype, bias)
    y = K.batch_normalization(y, *_bn_params(rng, c, dtype), axis=-1 if cl else 1,
                              epsilon=1e-3)
    if act == "relu":
        y = K.relu(y)
    elif act == "relu6":
        y = K.relu(y, max_value=6.0)
    feeds = [[rng.standard_normal((batch,) + shape[1:]).astype(dtype)] for batch in (5, 1, 0)]
    f, _ = _compare([x], [y], feeds[0], more_feeds=feeds[1:])
    opt, plain = _steps(f, True), _steps(f, False)
    assert len(opt) < len(plain)
    # the BatchNorm scale went into the weights: no per-call multiply is left
    assert not any("multiply" in s for s in opt), opt
    if kind != "separable":
        assert len(opt) == 1 and opt[0].startswith("Fused("), opt


@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
def test_batchnorm_folding_in_float64_and_noncontiguous_feed(fmt):
    rng = np.random.default_rng(3)
    cl = fmt == "channels_last"
    x = K.placeholder((None, 6, 5, 3) if cl else (None, 3, 6, 5), dtype="float64")
    y, c = _layer("conv2d", rng, x, fmt, "float64", True)
    y = K.relu(K.batch_normalization(y, *_bn_params(rng, c, "float64"), axis=-1 if cl else 1))
    X = rng.standard_normal((3, 5, 6, 4) if cl else (5, 6, 3, 4)).T       # not contiguous
    assert X.shape == (4,) + x.shape[1:] and not X.flags.c_contiguous
    _compare([x], [y], [X], rtol=1e-12)


@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
def test_batchnorm_folding_over_more_than_one_block(fmt):
    # 33 x 35 = 1155 pixels per channel: more than the kernel's 1024-element
    # block and not a multiple of it, in both layouts
    rng = np.random.default_rng(10)
    cl = fmt == "channels_last"
    x = K.placeholder((None, 33, 35, 2) if cl else (None, 2, 33, 35))
    k = K.variable(rng.standard_normal((3, 3, 2, 3)))
    y = K.bias_add(K.conv2d(x, k, padding="same", data_format=fmt),
                   K.variable(rng.standard_normal(3)), data_format=fmt)
    y = K.relu(K.batch_normalization(y, *_bn_params(rng, 3, "float32"), axis=-1 if cl else 1),
               max_value=6.0)
    feeds = [[rng.standard_normal((b,) + x.shape[1:]).astype("float32")] for b in (2, 1)]
    f, _ = _compare([x], [y], feeds[0], more_feeds=feeds[1:])
    assert len(_steps(f)) == 1


def test_per_call_channel_operands():
    # channel vectors that are inputs, not weights: fused, computed every call
    x = K.placeholder((None, 3, 4, 5))
    s = K.placeholder((3, 1, 1))
    t = K.placeholder((5,))
    y1 = K.relu(x * s + 1.5, alpha=0.2) - K.minimum(x, s)      # channels first
    y2 = K.maximum(x - t, 0.25) * t                            # the last axis
    rng = np.random.default_rng(11)
    feeds = [[rng.standard_normal((n, 3, 4, 5)).astype("float32"),
              rng.standard_normal((3, 1, 1)).astype("float32"),
              rng.standard_normal(5).astype("float32")] for n in (4, 0, 1)]
    f, _ = _compare([x, s, t], [y1, y2], feeds[0], exact=True, more_feeds=feeds[1:])
    assert sum(st.startswith("Fused") for st in _steps(f)) == 2


def test_residual_block_with_batchnorm_and_add():
    rng = np.random.default_rng(4)
    x = K.placeholder((None, 6, 6, 4))
    k1 = K.variable(rng.standard_normal((3, 3, 4, 4)) * 0.3)
    k2 = K.variable(rng.standard_normal((3, 3, 4, 4)) * 0.3)
    h = K.relu(K.batch_normalization(K.conv2d(x, k1, padding="same"),
                                     *_bn_params(rng, 4, "float32")))
    h = K.batch_normalization(K.conv2d(h, k2, padding="same"), *_bn_params(rng, 4, "float32"))
    y = K.relu(h + x)
    feeds = [[rng.standard_normal((batch, 6, 6, 4)).astype("float32")] for batch in (1, 3)]
    f, _ = _compare([x], [y], feeds[0], more_feeds=feeds[1:])
    opt, plain = _steps(f, True), _steps(f, False)
    assert len(opt) <= 2 < len(plain)
    assert not any("multiply" in s for s in opt), opt


def test_batchnorm_shared_output_is_not_folded_wrongly():
    # the conv output is read twice: folding must not change the other reader
    rng = np.random.default_rng(5)
    x = K.placeholder((None, 5, 5, 3))
    conv = K.conv2d(x, K.variable(rng.standard_normal((3, 3, 3, 4))), padding="same")
    y = K.batch_normalization(conv, *_bn_params(rng, 4, "float32"))
    _compare([x], [y, conv * 2.0], [rng.standard_normal((2, 5, 5, 3)).astype("float32")])


# ------------------------------------------------------------------ frozen weights

def _dense_bn_model(rng):
    x = K.placeholder((None, 4))
    w = K.variable(rng.standard_normal((4, 3)))
    b = K.variable(rng.standard_normal(3))
    bn = _bn_params(rng, 3, "float32")
    y = K.relu(K.batch_normalization(K.bias_add(K.dot(x, w), b), *bn))
    return x, y, w, b, bn


def _reference(x, y, X):
    _, (out,) = _run([x], [y], [X], False)
    return out


def test_frozen_weights_follow_every_kind_of_assignment():
    rng = np.random.default_rng(6)
    x, y, w, b, (mean, var, beta, gamma) = _dense_bn_model(rng)
    f = K.function([x], [y])
    X = rng.standard_normal((5, 4)).astype("float32")

    def check():
        np.testing.assert_allclose(f([X])[0], _reference(x, y, X), rtol=1e-5, atol=1e-5)

    check()
    K.set_value(w, rng.standard_normal((4, 3)))
    check()
    K.set_value(var, rng.uniform(0.1, 5.0, 3))
    check()
    K.batch_set_value([(gamma, rng.standard_normal(3)), (b, rng.standard_normal(3) * 5)])
    check()
    # a training-style function with updates changes two variables
    step = K.function([], [], updates=[K.update_add(beta, K.constant(np.ones(3, "float32"))),
                                       K.update(mean, mean * 0.5)])
    step([])
    check()
    # an update function fed through a placeholder of its own
    z = K.placeholder((None, 4))
    learn = K.function([z], [], updates=[K.update_sub(w, K.dot(K.transpose(z),
                                                                K.ones((5, 3))) * 0.01)])
    learn([rng.standard_normal((5, 4)).astype("float32")])
    check()


def test_unchanged_variables_do_not_refold_unrelated_steps(monkeypatch):
    rng = np.random.default_rng(7)
    x = K.placeholder((None, 4))
    # distinct shapes tell the two layers' weight steps apart: (5,) and (4, 5)
    # for the first, (3,) and (5, 3) for the second
    w1 = K.variable(rng.standard_normal((4, 5)))
    w2 = K.variable(rng.standard_normal((5, 3)))
    bn1 = _bn_params(rng, 5, "float32")
    bn2 = _bn_params(rng, 3, "float32")
    h = K.relu(K.batch_normalization(K.dot(x, w1), *bn1))
    y = K.batch_normalization(K.dot(h, w2), *bn2)
    unrelated = K.variable(np.zeros(2))
    f = K.function([x], [y])
    X = rng.standard_normal((3, 4)).astype("float32")
    f([X])

    calls = []
    for cls in (ew_ops.Unary, ew_ops.Binary):
        original = cls.compute

        def counted(self, *arrays, _original=original):
            out = _original(self, *arrays)
            calls.append((self.name, out[0].shape))
            return out

        monkeypatch.setattr(cls, "compute", counted)

    def names():
        return [name for name, _ in calls]

    def shapes():
        return {shape for _, shape in calls}

    f([X])
    assert calls == []          # nothing changed: no weight step runs again
    K.set_value(unrelated, np.ones(2))
    f([X])
    assert calls == []          # a variable the plan does not read
    K.set_value(bn2[3], rng.uniform(0.5, 2.0, 3))      # gamma of the second BN
    f([X])
    # a new gamma rescales: the variance's sqrt is not recomputed
    assert "sqrt" not in names() and "multiply" in names()
    assert shapes() <= {(3,), (5, 3)}, shapes()
    del calls[:]
    K.set_value(bn1[1], rng.uniform(0.5, 2.0, 5))      # variance of the first BN
    f([X])
    assert names().count("sqrt") == 1
    # nothing of the second BN is recomputed for the first one's variance
    assert shapes() <= {(5,), (4, 5)}, shapes()
    del calls[:]
    K.set_value(bn1[1], K.get_value(bn1[1]))            # same value, new version: recomputed
    f([X])
    assert names().count("sqrt") == 1 and shapes() <= {(5,), (4, 5)}
    monkeypatch.undo()
    np.testing.assert_allclose(f([X])[0], _reference(x, y, X), rtol=1e-5, atol=1e-5)


def test_weight_outputs_are_copies():
    v = K.variable(np.arange(6, dtype="float32").reshape(2, 3))
    f = K.function([], [v * 2.0, v, K.transpose(v) + 1.0])
    first = f([])
    for a in first:
        a[...] = -99.0
    second = f([])
    np.testing.assert_array_equal(second[0], np.arange(6).reshape(2, 3) * 2.0)
    np.testing.assert_array_equal(second[1], np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(second[2], np.arange(6).reshape(2, 3).T + 1.0)
    np.testing.assert_array_equal(K.get_value(v), np.arange(6).reshape(2, 3))
    # next to a per-call output too
    x = K.placeholder((None, 3))
    g = K.function([x], [x + v, v * 3.0])
    out = g([np.ones((2, 3), "float32")])
    out[1][...] = 0
    np.testing.assert_array_equal(g([np.ones((2, 3), "float32")])[1],
                                  np.arange(6).reshape(2, 3) * 3.0)


def test_identity_of_a_variable_is_a_copy_with_the_optimizer_off():
    v = K.variable(np.ones(3))
    x = K.placeholder((3,))
    for optimize in (True, False):
        _, (out,) = _run([x], [K.identity(v)], [np.zeros(3, "float32")], optimize)
        out[...] = 7.0
        np.testing.assert_array_equal(K.get_value(v), np.ones(3), err_msg=str(optimize))


# ------------------------------------------------------------------ training plans

def _train(optimize, steps=6):
    rng = np.random.default_rng(8)
    K.set_graph_optimizer(optimize)
    try:
        x = K.placeholder((None, 5))
        t = K.placeholder((None, 2))
        w1 = K.variable(rng.standard_normal((5, 8)) * 0.5)
        b1 = K.variable(np.zeros(8))
        w2 = K.variable(rng.standard_normal((8, 2)) * 0.5)
        b2 = K.variable(np.zeros(2))
        h = K.relu(K.bias_add(K.dot(x, w1), b1), alpha=0.05)
        out = K.bias_add(K.dot(h, w2), b2)
        loss = K.mean(K.square(out - t)) + 1e-3 * K.sum(K.square(w1))
        params = [w1, b1, w2, b2]
        grads = K.gradients(loss, params)
        updates = [K.update_sub(p, 0.1 * g) for p, g in zip(params, grads)]
        train = K.function([x, t], [loss], updates=updates)
        X = rng.standard_normal((16, 5)).astype("float32")
        T = rng.standard_normal((16, 2)).astype("float32")
        losses = [train([X, T])[0] for _ in range(steps)]
        steps_repr = [repr(op) for op in train.plan_ops(0)]
        return losses, [K.get_value(p) for p in params], steps_repr
    finally:
        K.set_graph_optimizer(True)


def test_training_is_bit_identical_with_the_optimizer():
    l_off, w_off, s_off = _train(False)
    l_on, w_on, s_on = _train(True)
    assert any("Fused" in s for s in s_on)       # the exact fusion did something
    assert l_on[-1] < l_on[0]
    np.testing.assert_array_equal(np.array(l_on), np.array(l_off))
    for a, b in zip(w_on, w_off):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------ threads

def test_readers_see_old_or_new_weights_never_a_mix():
    rng = np.random.default_rng(9)
    x, y, w, b, (mean, var, beta, gamma) = _dense_bn_model(rng)
    f = K.function([x], [y])
    X = rng.standard_normal((6, 4)).astype("float32")
    g_old = K.get_value(gamma)
    g_new = -2.0 * g_old + 0.5
    ref_old = f([X])[0]
    K.set_value(gamma, g_new)
    ref_new = f([X])[0]
    np.testing.assert_allclose(ref_new, _reference(x, y, X), rtol=1e-5, atol=1e-5)
    K.set_value(gamma, g_old)
    assert not np.allclose(ref_old, ref_new)

    stop = threading.Event()
    bad, counts, errors = [], [0, 0], []

    def reader():
        try:
            for _ in range(150):
                r = f([X])[0]
                if np.allclose(r, ref_old, rtol=1e-6, atol=1e-6):
                    counts[0] += 1
                elif np.allclose(r, ref_new, rtol=1e-6, atol=1e-6):
                    counts[1] += 1
                else:
                    bad.append(r)
        except Exception as e:      # reported below
            errors.append(e)

    def writer():
        i = 0
        while not stop.is_set():
            K.set_value(gamma, g_new if i % 2 == 0 else g_old)
            i += 1

    readers = [threading.Thread(target=reader) for _ in range(4)]
    w_thread = threading.Thread(target=writer)
    w_thread.start()
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    stop.set()
    w_thread.join()
    assert not errors, errors
    assert not bad, "%d mixed results, e.g. %s" % (len(bad), bad[0])
    assert sum(counts) == 600


# ------------------------------------------------------------------ in-kernel epilogues

@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("act", [None, "relu", "relu6"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_depthwise_bias_and_activation_run_in_the_kernel(data_format, act, with_bias):
    rng = np.random.default_rng(11)
    last = data_format == "channels_last"
    x = K.placeholder((None, 6, 7, 3) if last else (None, 3, 6, 7))
    k = K.variable(rng.standard_normal((3, 3, 3, 2)).astype("float32"))
    y = K.depthwise_conv2d(x, k, padding="same", data_format=data_format)
    if with_bias:
        y = K.bias_add(y, K.variable(rng.standard_normal(6).astype("float32")),
                       data_format=data_format)
    if act == "relu":
        y = K.relu(y)
    elif act == "relu6":
        y = K.relu(y, max_value=6.0)
    if not with_bias and act is None:
        pytest.skip("nothing to fuse")
    feed = [(rng.standard_normal((2, 6, 7, 3) if last else (2, 3, 6, 7)) * 4).astype("float32")]
    f, got = _run([x], [y], feed, True)
    _, ref = _run([x], [y], feed, False)
    fused = [op for op in f.plan_ops(0) if getattr(op, "in_kernel", None)]
    assert len(fused) == 1 and fused[0].in_kernel[-1] == act
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-6)
    # batch 0 and a non-contiguous feed take the same step
    np.testing.assert_allclose(f([feed[0][::-1]])[0], _run([x], [y], [feed[0][::-1]], False)[1][0],
                               rtol=1e-5, atol=1e-6)
    assert f([feed[0][:0]])[0].shape[0] == 0


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("act", [None, "relu", "relu6"])
def test_conv_bias_residual_and_activation_run_in_the_kernel(data_format, rank, act):
    # A ResNet tail, conv + bias + shortcut -> relu, is one kernel pass with
    # the same bits as the ops one by one (the adds are done in the same order).
    rng = np.random.default_rng(12)
    last = data_format == "channels_last"
    sp = (7, 6, 5)[:rank]
    shape = (None,) + (sp + (3,) if last else (3,) + sp)
    x = K.placeholder(shape)
    k = K.variable(rng.standard_normal((3,) * rank + (3, 3)).astype("float32"))
    conv = {1: K.conv1d, 2: K.conv2d, 3: K.conv3d}[rank]
    y = conv(x, k, padding="same", data_format=data_format)
    y = K.bias_add(y, K.variable(rng.standard_normal(3).astype("float32")),
                   data_format=data_format)
    y = y + x
    if act == "relu":
        y = K.relu(y)
    elif act == "relu6":
        y = K.relu(y, max_value=6.0)
    feed = [(rng.standard_normal((2,) + shape[1:]) * 3).astype("float32")]
    # Both plans on the same convolution path: the inference plan would run
    # these few positions on the packed kernel, whose sums BLAS's im2col
    # product orders differently by BLAS build.
    packed = conv_kernels._TUNE["packed"]
    conv_kernels._TUNE["packed"] = False
    try:
        f, got = _run([x], [y], feed, True)
        _, ref = _run([x], [y], feed, False)
    finally:
        conv_kernels._TUNE["packed"] = packed
    op, = f.plan_ops(0)
    assert op.in_kernel is not None and op.in_kernel[1] is not None
    assert op.in_kernel[-1] == act
    np.testing.assert_array_equal(got[0], ref[0])
    # an empty batch takes the same step
    assert f([feed[0][:0]])[0].shape[0] == 0


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [3, 500])
@pytest.mark.parametrize("rank", [2, 3])
def test_dense_bias_starts_the_gemm(rows, rank, threads):
    # on one thread every product here is a kernels.linalg.dense call (a 3-D
    # input as its 2-D view); on a team of 2 (the tests' cutoff is 0) the
    # larger ones go to matmul
    old = runtime.get_max_threads()
    runtime.set_num_threads(threads)
    try:
        _dense_bias_values(rows, rank)
    finally:
        runtime.set_num_threads(old)


def _dense_bias_values(rows, rank):
    # x @ W + b: the bias is the GEMM's initial accumulator (no pass of its
    # own), a 3-D input included. A relu after it is the step's too: applied
    # in the same kernels.linalg.dense call, or in place after matmul.
    rng = np.random.default_rng(13)
    x = K.placeholder((None,) * (rank - 1) + (40,))
    W = K.variable(rng.standard_normal((40, 72)).astype("float32"))
    b = K.variable(rng.standard_normal(72).astype("float32"))
    y = K.bias_add(K.dot(x, W), b)
    feed = [rng.standard_normal((rows,) + (2,) * (rank - 2) + (40,)).astype("float32")]
    f, got = _run([x], [y], feed, True)
    _, ref = _run([x], [y], feed, False)
    op, = f.plan_ops(0)
    assert op.in_kernel is not None and op.in_kernel[0] is not None and op.in_kernel[-1] is None
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-5)
    assert f([feed[0][:0]])[0].shape[0] == 0
    f, got = _run([x], [K.relu(y)], feed, True)
    op, = f.plan_ops(0)
    assert op.in_kernel is not None and op.in_kernel[-1] == "relu"
    np.testing.assert_allclose(got[0], np.maximum(ref[0], 0), rtol=1e-5, atol=1e-5)
    for n in (0, 1, 4, 5):
        np.testing.assert_allclose(f([feed[0][:n]])[0], np.maximum(ref[0][:n], 0),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("act", [None, "relu", "relu6"])
def test_small_dense_runs_bias_and_activation_in_one_pass(act, threads):
    # kernels.linalg.dense: one pass of dense_rows at batch 1; on one thread
    # (or below the team's cutoff) one GEMM from the bias rows and the
    # activation in the same call at batch 32; with a team, the product,
    # then the activation in place
    old = runtime.get_max_threads()
    runtime.set_num_threads(threads)
    try:
        _small_dense_values(act)
    finally:
        runtime.set_num_threads(old)


def _small_dense_values(act):
    rng = np.random.default_rng(14)
    x = K.placeholder((None, 24))
    W = K.variable(rng.standard_normal((24, 10)).astype("float32"))
    b = K.variable(rng.standard_normal(10).astype("float32"))
    y = K.bias_add(K.dot(x, W), b)
    y = y if act is None else K.relu(y) if act == "relu" else K.relu(y, max_value=6.0)
    for rows in (1, 32):
        feed = [rng.standard_normal((rows, 24)).astype("float32") * 3]
        feed[0][0, :3] = np.nan
        f, got = _run([x], [y], feed, True)
        _, ref = _run([x], [y], feed, False)
        op, = f.plan_ops(0)
        assert op.in_kernel[-1] == act
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-5)
        assert np.isnan(got[0][0]).all()
        if act == "relu6" and rows > 1:
            assert got[0][1:].max() == 6.0


def test_training_plans_keep_the_dense_bias_add():
    # the GEMM's initial value and dense_rows round differently from a
    # product followed by an add: a training plan keeps values bit-identical
    rng = np.random.default_rng(15)
    x = K.placeholder((None, 24))
    W = K.variable(rng.standard_normal((24, 10)).astype("float32"))
    b = K.variable(rng.standard_normal(10).astype("float32"))
    n = K.variable(0.0)
    y = K.relu(K.bias_add(K.dot(x, W), b))
    feed = [rng.standard_normal((1, 24)).astype("float32")]
    f, got = _run([x], [y], feed, True, updates=[(n, n + 1)])
    _, ref = _run([x], [y], feed, False, updates=[(n, n + 1)])
    assert all(getattr(op, "in_kernel", None) is None for op in f.plan_ops(0))
    np.testing.assert_array_equal(got[0], ref[0])


@pytest.mark.parametrize("shape,fused", [((None, 40, 40, 24), True), ((None, 8, 16), False)])
def test_a_lone_element_wise_op_runs_on_the_kernel_when_large(shape, fused):
    # relu of a tensor other steps read too: alone in its group, it takes the
    # threaded kernel only when its output is large, with NumPy's values
    x = K.placeholder(shape)
    y = K.relu(x * 2.0)
    outs = [K.relu(y), y + 1.0]
    rng = np.random.default_rng(3)
    feed = rng.standard_normal((3,) + shape[1:]).astype("float32")
    feed.flat[::7] = np.nan
    f, got = _compare([x], outs, [feed], exact=True)
    kinds = [type(op).__name__ for op in f.plan_ops(0)]
    assert kinds.count("Fused") == (3 if fused else 1), kinds
    np.testing.assert_array_equal(got[0], np.maximum(np.maximum(feed * 2, 0), 0))


def test_a_lone_relu_takes_the_kernel_sooner_than_a_lone_add():
    # NumPy's maximum with a scalar is several times slower than its add: a
    # lone relu of a mid-sized map runs on the kernel, a lone add of the same
    # size on NumPy (graph/fusion.py SINGLE_MAX_MIN_SIZE, SINGLE_OP_MIN_SIZE)
    from cyback.graph import fusion
    shape = (None, 32, 16, 24)
    assert fusion.SINGLE_MAX_MIN_SIZE <= 32 * 16 * 24 < fusion.SINGLE_OP_MIN_SIZE
    x = K.placeholder(shape)
    y = x * 2.0
    outs = [K.relu(y), y + 1.0, y * 3.0]
    feed = np.random.default_rng(4).standard_normal((2,) + shape[1:]).astype("float32")
    feed.flat[::5] = np.nan
    f, got = _compare([x], outs, [feed], exact=True)
    kinds = [type(op).__name__ for op in f.plan_ops(0)]
    assert kinds.count("Fused") == 1 and "Relu" not in kinds, kinds
    np.testing.assert_array_equal(got[0], np.maximum(feed * 2, 0))


def test_conv_epilogue_stays_a_separate_pass():
    # a scalar offset is not a bias: the fused step runs the conv, then the
    # program in place
    x = K.placeholder((None, 5, 5, 2))
    k = K.variable(np.ones((3, 3, 2, 4), "float32"))
    f, _ = _run([x], [K.relu(K.conv2d(x, k) - 1.0)], [np.ones((1, 5, 5, 2), "float32")], True)
    op, = f.plan_ops(0)
    assert op.base is not None and op.in_kernel is None


def test_reductions_expand_dims_and_tiles_of_a_fill_fold_into_one_fill():
    # Keras's RNN zero state: zeros_like(x) -> sum over time and features ->
    # expand_dims -> tile to the units. One step in an inference plan.
    x = K.placeholder((None, 5, 3))
    z = K.tile(K.expand_dims(K.sum(K.zeros_like(x), axis=(1, 2))), [1, 4])
    f, _ = _run([x], [z], [np.ones((2, 5, 3), "float32")], True)
    steps = _steps(f)
    assert len(steps) == 1 and "Fill" in steps[0], steps
    for n in (0, 1, 3):
        feed = [np.random.rand(n, 5, 3).astype("float32")]
        got = f(feed)[0]
        want = _run([x], [z], feed, False)[1][0]
        assert got.shape == want.shape == (n, 4) and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("build, folds", [
    (lambda x: K.mean(K.ones_like(x), axis=1, keepdims=True), True),
    (lambda x: K.max(K.ones_like(x), axis=2), True),
    (lambda x: K.min(K.ones_like(x), axis=(1, 2)), True),
    (lambda x: K.sum(K.ones_like(x), axis=1), False),        # a sum of ones is not one
    (lambda x: K.prod(K.zeros_like(x), axis=1), False),
    (lambda x: K.max(K.zeros_like(x), axis=0), False),       # the batch axis: unknown size
    (lambda x: K.tile(K.ones_like(x), K.stack([K.shape(x)[0], 1, 1])), False),  # symbolic reps
])
def test_fill_folding_keeps_values(build, folds):
    x = K.placeholder((None, 5, 3))
    y = build(x)
    f, _ = _run([x], [y], [np.ones((2, 5, 3), "float32")], True)
    steps = _steps(f)
    assert (len(steps) == 1 and "Fill" in steps[0]) == folds, steps
    for n in (1, 3):
        feed = [np.random.rand(n, 5, 3).astype("float32")]
        np.testing.assert_array_equal(f(feed)[0], _run([x], [y], feed, False)[1][0])


# ------------------------------------------------- narrow Dense kernels

@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n,narrow", [(10, True), (16, True), (1, True), (17, False)])
def test_narrow_dense_reads_its_kernel_transposed(dtype, n, narrow):
    rng = np.random.default_rng(n)
    x = K.placeholder((None, 300), dtype=dtype)
    W = K.variable(rng.standard_normal((300, n)), dtype=dtype)
    b = K.variable(rng.standard_normal(n), dtype=dtype)
    y = K.relu(K.dot(x, W) + b)
    feeds = [[rng.standard_normal((batch, 300)).astype(dtype)] for batch in (1, 5, 0)]
    f, _ = _compare([x], [y], feeds[0], more_feeds=feeds[1:])
    opt = _steps(f)
    assert len(opt) == 1 and ("NarrowProduct" in opt[0]) == narrow, opt
    # a new kernel value reaches the transposed copy
    K.set_value(W, np.ones((300, n)))
    got = f([np.ones((1, 300), dtype)])[0]
    want = np.maximum(300 + K.get_value(b), 0)[None]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_training_plans_keep_the_product():
    x = K.placeholder((None, 50))
    W = K.variable(np.ones((50, 4)))
    step = K.variable(0.0)
    f = K.function([x], [K.dot(x, W)], updates=[K.update_add(step, 1.0)])
    assert not any("NarrowProduct" in s for s in _steps(f))
    np.testing.assert_allclose(f([np.ones((1, 50), np.float32)])[0], np.full((1, 4), 50))
