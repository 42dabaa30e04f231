"""Compiled functions: feeds, updates (Theano semantics), rewrites, threads,
learning-phase specialisation."""
import sys

import numpy as np
import pytest
from thread_runner import run_threads

import cyback as K
from cyback import config
from cyback.ops import elementwise as ew
from cyback.ops.shape import reshape


def _step_names(f, lp=0):
    """The ops of f's plan as written (the optimizer fuses them otherwise)."""
    K.set_graph_optimizer(False)
    try:
        return [getattr(op, "name", type(op).__name__) for op in f.plan_ops(lp)]
    finally:
        K.set_graph_optimizer(True)


# ------------------------------------------------------------------ feeds

def test_basic_call_and_output_types():
    x = K.placeholder((None, 3), name="x")
    f = K.function([x], [x * 2, K.sum(x)])
    out = f([np.ones((2, 3), "float32")])
    assert isinstance(out, list) and len(out) == 2
    np.testing.assert_allclose(out[0], 2 * np.ones((2, 3)))
    assert out[0].dtype == np.float32
    assert np.ndim(out[1]) == 0 and float(out[1]) == 6.0


def test_single_tensor_output_is_not_a_list():
    x = K.placeholder((2,))
    f = K.function([x], x + 1)
    out = f([np.zeros(2)])
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, [1, 1])


def test_tuple_inputs_and_outputs():
    x = K.placeholder((2,))
    y = K.placeholder((2,))
    f = K.function((x, y), (x + y,))
    np.testing.assert_allclose(f((np.ones(2), np.ones(2)))[0], [2, 2])


@pytest.mark.parametrize("value,msg", [
    (np.ones((2, 4)), r"'x' expects shape \(None, 3\), got a value of shape \(2, 4\)"),
    (np.ones(3), r"'x' expects shape \(None, 3\), got a value of shape \(3,\)"),
    (np.ones((1, 1, 3)), r"'x' expects shape"),
])
def test_feed_shape_errors_name_the_placeholder(value, msg):
    x = K.placeholder((None, 3), name="x")
    f = K.function([x], [x * 2], name="myfn")
    with pytest.raises(ValueError, match=msg):
        f([value])
    with pytest.raises(ValueError, match="function 'myfn'"):
        f([value])


@pytest.mark.parametrize("value", [np.array([["a", "b", "c"]]), None,
                                   np.array([[1 + 1j, 2, 3]])])
def test_feed_dtype_errors(value):
    x = K.placeholder((None, 3), name="xin")
    f = K.function([x], [x * 2])
    with pytest.raises(TypeError, match="placeholder 'xin' has dtype float32"):
        f([value])


def test_feed_conversions():
    x = K.placeholder((None, 3), dtype="float32")
    f = K.function([x], [x * 2])
    # int and float64 values, Python lists, non-contiguous arrays are converted.
    np.testing.assert_allclose(f([np.ones((2, 3), "int64")])[0], 2 * np.ones((2, 3)))
    np.testing.assert_allclose(f([[[1, 2, 3]]])[0], [[2, 4, 6]])
    out = f([np.ones((2, 3), "float64")])[0]
    assert out.dtype == np.float32
    big = np.arange(24, dtype="float32").reshape(4, 6)
    np.testing.assert_allclose(f([big[:, ::2]])[0], big[:, ::2] * 2)
    np.testing.assert_allclose(f([big.T[::2, :3]])[0], big.T[::2, :3] * 2)
    # Empty batch.
    assert f([np.zeros((0, 3), "float32")])[0].shape == (0, 3)


def test_int_placeholder_feeds():
    i = K.placeholder((2,), dtype="int32", name="idx")
    f = K.function([i], [i + 1])
    out = f([np.array([1.0, 2.0])])[0]
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [2, 3])
    with pytest.raises(TypeError, match="'idx'"):
        f([np.array([1.5, 2.0])])


def test_wrong_number_of_inputs():
    x = K.placeholder((2,), name="a")
    y = K.placeholder((2,), name="b")
    f = K.function([x, y], [x + y])
    with pytest.raises(ValueError, match=r"expected 2 input value\(s\).*'a', 'b'"):
        f([np.ones(2)])


def test_missing_placeholder_is_reported_at_construction():
    x = K.placeholder((None, 3), name="given")
    y = K.placeholder((None, 3), name="forgotten")
    with pytest.raises(ValueError, match=r"placeholder 'forgotten' \(None, 3\).*not among"):
        K.function([x], [x + y])


def test_inputs_must_be_placeholders():
    with pytest.raises(TypeError, match="placeholder"):
        K.function([K.variable(1.0)], [K.variable(2.0)])


def test_unused_inputs_are_accepted():
    x = K.placeholder((2,))
    unused = K.placeholder((5,))
    f = K.function([x, unused], [x * 3])
    np.testing.assert_allclose(f([np.ones(2), "ignored"])[0], [3, 3])


def test_dict_feeds():
    x = K.placeholder((2,), name="dx")
    y = K.placeholder((2,), name="dy")
    f = K.function([x, y], [x - y])
    np.testing.assert_allclose(f({x: [3, 3], y: [1, 2]})[0], [2, 1])
    np.testing.assert_allclose(f({"dx": [3, 3], "dy": [1, 2]})[0], [2, 1])
    with pytest.raises(ValueError, match="no value for placeholder 'dy'"):
        f({x: [1, 1]})


def test_dict_of_inputs():
    x = K.placeholder((2,))
    f = K.function({"in": x}, [x * 2])
    np.testing.assert_allclose(f([[1, 2]])[0], [2, 4])


def test_invalid_kwargs():
    x = K.placeholder((2,))
    with pytest.raises(ValueError, match="invalid keyword"):
        K.function([x], [x], bogus=1)


def test_feed_dict_and_fetches_kwargs():
    x = K.placeholder((2,))
    extra = K.placeholder((2,), name="extra")
    v = K.variable([0.0, 0.0])
    f = K.function([x], [x + extra], feed_dict={extra: np.array([10.0, 20.0])},
                   fetches=[K.update_add(v, x)])
    np.testing.assert_allclose(f([np.ones(2)])[0], [11, 21])
    np.testing.assert_allclose(K.get_value(v), [1, 1])


def test_outputs_do_not_alias_variables_or_constants():
    v = K.variable([1.0, 2.0])
    c = K.constant([3.0, 4.0])
    f = K.function([], [v, c])
    a, b = f([])
    a[0] = 100.0
    b[0] = 100.0
    np.testing.assert_allclose(K.get_value(v), [1, 2])
    np.testing.assert_allclose(f([])[1], [3, 4])


def test_run_error_names_the_op():
    x = K.placeholder((None,))
    f = K.function([x], [reshape(x, (2, 3))])
    with pytest.raises(ValueError, match="reshape"):
        f([np.ones(5)])


# ------------------------------------------------------------------ updates

def test_updates_swap_uses_pre_update_values():
    a = K.variable(1.0)
    b = K.variable(2.0)
    f = K.function([], [], updates=[(a, b), (b, a)])
    f([])
    assert K.get_value(a) == 2.0 and K.get_value(b) == 1.0
    f([])
    assert K.get_value(a) == 1.0 and K.get_value(b) == 2.0


def test_outputs_see_pre_update_values():
    a = K.variable(1.0)
    f = K.function([], [a * 10], updates=[K.update_add(a, 1.0)])
    assert f([])[0] == 10.0
    assert K.get_value(a) == 2.0
    assert f([])[0] == 20.0


def test_updates_of_several_kinds():
    x = K.placeholder((2,))
    a = K.variable([0.0, 0.0])
    b = K.variable([5.0, 5.0])
    c = K.variable([1.0, 1.0])
    m = K.variable([0.0, 0.0])
    f = K.function([x], [], updates=[K.update(a, x), K.update_sub(b, x), (c, c * x),
                                     K.moving_average_update(m, x, 0.9)])
    f([np.array([2.0, 3.0])])
    np.testing.assert_allclose(K.get_value(a), [2, 3])
    np.testing.assert_allclose(K.get_value(b), [3, 2])
    np.testing.assert_allclose(K.get_value(c), [2, 3])
    np.testing.assert_allclose(K.get_value(m), [0.2, 0.3], rtol=1e-6)
    assert K.get_value(a).dtype == np.float32


def test_updates_as_dict():
    a = K.variable(1.0)
    K.function([], [], updates={a: a + 1})([])
    assert K.get_value(a) == 2.0


def test_updates_all_or_nothing():
    x = K.placeholder((None,))
    a = K.variable(1.0)
    c = K.variable(np.zeros(3))
    f = K.function([x], [], updates=[(a, a + 1), (c, reshape(x, (-1,)))])
    with pytest.raises(ValueError, match="shape"):
        f([np.ones(6)])
    assert K.get_value(a) == 1.0
    np.testing.assert_allclose(K.get_value(c), [0, 0, 0])
    f([np.ones(3)])
    assert K.get_value(a) == 2.0
    np.testing.assert_allclose(K.get_value(c), [1, 1, 1])


def test_update_failing_in_a_step_assigns_nothing():
    x = K.placeholder((None,))
    a = K.variable(1.0)
    b = K.variable(np.zeros(2))
    f = K.function([x], [], updates=[(a, a + 1), (b, reshape(x, (2,)))])
    with pytest.raises(ValueError):
        f([np.ones(3)])
    assert K.get_value(a) == 1.0


def test_bad_updates():
    a = K.variable(1.0)
    with pytest.raises(ValueError, match="pair"):
        K.function([], [], updates=[(a, a, a)])
    with pytest.raises(TypeError, match="update"):
        K.function([], [], updates=[3])
    with pytest.raises(TypeError, match="variable"):
        K.function([], [], updates=[(K.placeholder(()), 1.0)])
    with pytest.raises(ValueError, match="shape"):
        K.function([], [], updates=[(K.variable([1.0, 2.0]), K.variable([1.0, 2.0, 3.0]))])


def test_variable_owns_its_storage_after_update():
    a = K.variable([1.0, 2.0])
    b = K.variable([3.0, 4.0])
    K.function([], [], updates=[(a, b)])([])
    K.set_value(b, [7.0, 8.0])
    np.testing.assert_allclose(K.get_value(a), [3, 4])


# ------------------------------------------------------------------ rewrites

def test_cse_merges_equal_subexpressions():
    x = K.placeholder((2, 2))
    f = K.function([x], [K.exp(x) + K.exp(x)])
    assert _step_names(f).count("exp") == 1
    np.testing.assert_allclose(f([np.zeros((2, 2))])[0], 2 * np.ones((2, 2)))


def test_constant_folding():
    x = K.placeholder((2, 2))
    c = K.constant(np.ones((2, 2)))
    v = K.variable(np.ones((2, 2)))
    # constant-only parts fold at build time: no step for exp(c) * 2
    f = K.function([x], [x + K.exp(c) * 2 + v * 1])
    names = _step_names(f)
    assert "exp" not in names
    assert names.count("add") == 2 and names.count("multiply") == 1
    np.testing.assert_allclose(f([np.zeros((2, 2))])[0], 2 * np.e + 1, rtol=1e-6)


def test_eager_folding_of_constant_inputs():
    t = K.exp(K.constant([0.0, 1.0]))
    assert t.node is None
    np.testing.assert_allclose(K.eval(t), [1, np.e], rtol=1e-6)


def test_unneeded_steps_are_dropped():
    x = K.placeholder((2,))
    _ = K.exp(x)
    f = K.function([x], [x * 2])
    assert _step_names(f) == ["multiply"]


def test_random_ops_give_fresh_numbers_per_call():
    r = K.random_uniform((50,))
    f = K.function([], [r, r * 1])
    a, a1 = f([])
    b, _ = f([])
    np.testing.assert_allclose(a, a1)   # one draw per call, shared by its users
    assert not np.allclose(a, b)
    # two separate draws are not merged by CSE
    g = K.function([], [K.random_uniform((50,)) - K.random_uniform((50,))])
    assert np.abs(g([])[0]).max() > 0


# ------------------------------------------------------------------ learning phase

def test_learning_phase_specialisation():
    x = K.placeholder((2,))
    lp = K.learning_phase()
    out = ew.where(lp, x * 10, x - 1)
    f = K.function([x, lp], [out])
    np.testing.assert_allclose(f([np.ones(2), 1])[0], [10, 10])
    np.testing.assert_allclose(f([np.ones(2), 0])[0], [0, 0])
    # each plan keeps only its branch
    assert _step_names(f, 0) == ["subtract"]
    assert _step_names(f, 1) == ["multiply"]


def test_learning_phase_default_and_fixed():
    x = K.placeholder((2,))
    out = ew.where(K.learning_phase(), x * 10, x - 1)
    f = K.function([x], [out])
    np.testing.assert_allclose(f([np.ones(2)])[0], [0, 0])   # unfed: test phase
    try:
        K.set_learning_phase(1)
        np.testing.assert_allclose(f([np.ones(2)])[0], [10, 10])
    finally:
        config.reset_learning_phase()


# ------------------------------------------------------------------ threads

def test_reentrant_calls_from_threads():
    rs = np.random.RandomState(0)
    wv = rs.randn(3, 4).astype("float32")
    x = K.placeholder((None, 3))
    w = K.variable(wv)
    f = K.function([x], [K.dot(x, w) + K.sum(x)])
    ok = []

    def worker(i):
        for k in range(100):
            xv = np.full((1 + (i + k) % 3, 3), float(i * 1000 + k), "float32")
            out = f([xv])[0]
            expect = xv.dot(wv) + xv.sum()
            ok.append(np.allclose(out, expect, rtol=1e-5))
    run_threads(4, worker)
    assert len(ok) == 400 and all(ok)


# ------------------------------------------------------------------ overhead

def _python_calls(fn):
    """Python functions and builtins that ``fn()`` calls, each once per call,
    as "name file" (a count of work, which a loaded machine cannot change)."""
    calls = []

    def profile(frame, event, arg):
        if event == "call":
            calls.append("%s %s" % (frame.f_code.co_name, frame.f_code.co_filename))
        elif event == "c_call":
            calls.append("builtin %s" % getattr(arg, "__name__", arg))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls[:-1]                   # the last one is the setprofile(None)


def test_per_call_overhead_is_a_few_python_calls():
    """A compiled function's call is its generated plan: a handful of Python
    calls around the ops' computes (Function.__call__, the plan, the one
    op), the same on every call once the second has bound the plan
    (graph/binding.py): the per-call overhead does not grow with use. The
    bound is generous (about twice what a call makes); going over
    it means a layer of Python work was added to every call of every model
    (benchmarks/bench_overhead.py then says what it costs)."""
    x = K.placeholder((None, 8))
    f = K.function([x], [x + 1.0])
    xv = np.ones((1, 8), "float32")
    for _ in range(2):
        np.testing.assert_array_equal(f([xv])[0], xv + 1)
    first = _python_calls(lambda: f([xv]))
    for _ in range(50):
        f([xv])
    later = _python_calls(lambda: f([xv]))
    assert len(later) <= 20, "one call of function([x], [x + 1]) makes %d Python calls:\n  %s" \
        % (len(later), "\n  ".join(later))
    assert len(later) == len(first), (first, later)


# ------------------------------------------------------------ inline steps

def _inline_case():
    x = K.placeholder((None, 3, 4), name="x")
    outs = [K.permute_dimensions(x, (1, 0, 2))[1],      # Transpose, then GetItem
            K.ones_like(x),                              # Fill (non-zero)
            K.zeros_like(x),                             # Fill (zeros)
            K.batch_flatten(x)]                          # BatchFlatten
    return x, outs


@pytest.mark.parametrize("optimize", [True, False])
@pytest.mark.parametrize("batch", [0, 1, 5])
def test_views_and_fills_run_inline_in_the_plan(optimize, batch):
    # Steps whose ops set inline_in_plan run as source in the plan (no call
    # of their compute), with compute's values, dtypes and shapes.
    K.set_graph_optimizer(optimize)
    try:
        x, outs = _inline_case()
        f = K.function([x], outs)
        xv = np.arange(batch * 12, dtype=np.float32).reshape(batch, 3, 4)
        got = f([xv])
        src = f._plan(0).src
    finally:
        K.set_graph_optimizer(True)
    for piece in ("np_transpose(", "np_full(", "np_zeros(", "math_prod("):
        assert piece in src
    for line in src.splitlines():
        if any(op in line for op in ("(Transpose)", "(GetItem)", "(Fill)", "(BatchFlatten)")):
            assert ", = f" not in line, line
    want = [xv.transpose(1, 0, 2)[1], np.ones_like(xv), np.zeros_like(xv),
            xv.reshape(batch, 12)]
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def test_inline_step_failure_names_the_op():
    x = K.placeholder((None, 3), name="x")
    f = K.function([x], [x[4] * 2])
    with pytest.raises(IndexError, match="__getitem__"):
        f([np.ones((2, 3), np.float32)])


def test_fill_with_dims_inline_matches_compute():
    # The zero initial state Keras builds for an RNN becomes a Fill of the
    # input's batch and the units; the inline source computes the same.
    from cyback.graph.tensor import Constant
    from cyback.ops.elementwise import Fill
    like = np.ones((3, 7, 2), np.float32)
    for value, dims in [(0, ((0, 1), (None, 36))), (2.5, ((1, 2), (0, 1))), (1, None)]:
        op = Fill(value, "float32", dims)
        ns = {}
        src, _, _ = op.inline_src([Constant(like)], None, ns, ["like"])
        ns["like"] = like
        got = eval(src, ns)
        want = op.compute(like)[0]
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
