"""graph/binding.py and graph/plan_source.py: an inference plan called again
on feeds of the same shapes runs its steps' prepared kernel calls directly,
with the plain plan's values to the bit, and goes back to the plain plan for
anything else."""
import threading

import numpy as np
import pytest

import cyback as K
from cyback.graph import binding, plan_source
from cyback.ops import conv as conv_ops


@pytest.fixture
def bound_plans():
    previous = binding.set_enabled(True)
    yield
    binding.set_enabled(previous)


def _net(rng, data_format="channels_last"):
    """A small network of the steps that bind: convolutions with their bias,
    residual and relu in the kernel, a depthwise convolution, max and average
    pooling, a dense layer on packed weights, an element-wise program."""
    last = data_format == "channels_last"
    shape = (None, 9, 11, 6) if last else (None, 6, 9, 11)
    x = K.placeholder(shape, name="x")

    def var(*s):
        return K.variable(rng.standard_normal(s).astype("float32") * 0.3)

    h = K.relu(K.bias_add(K.conv2d(x, var(3, 3, 6, 8), padding="same",
                                   data_format=data_format), var(8),
                          data_format=data_format))
    d = K.bias_add(K.depthwise_conv2d(h, var(3, 3, 8, 1), padding="same",
                                      data_format=data_format), var(8),
                   data_format=data_format)
    r = K.relu(K.conv2d(K.relu(d), var(1, 1, 8, 8), data_format=data_format) + h)
    p = K.pool2d(r, (2, 2), strides=(2, 2), pool_mode="max", data_format=data_format)
    a = K.pool2d(r, (3, 3), strides=(1, 1), padding="same", pool_mode="avg",
                 data_format=data_format)
    flat = K.batch_flatten(p)
    dense = K.dot(flat, var(4 * 5 * 8, 10)) + var(10)
    out = K.sigmoid(dense) * 2.0 - 1.0
    return x, [out, K.mean(a, axis=(1, 2) if last else (2, 3))]


def _bound_source(f):
    binding_ = f._plan(0).binding
    return None if binding_ is None else binding_.source()


def _plain_outputs(f, feeds):
    previous = binding.set_enabled(False)
    try:
        return f(feeds)
    finally:
        binding.set_enabled(previous)


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_bound_plan_gives_the_plain_plans_bits(bound_plans, data_format):
    rng = np.random.default_rng(0)
    x, outs = _net(rng, data_format)
    f = K.function([x], outs)
    shape = (3, 9, 11, 6) if data_format == "channels_last" else (3, 6, 9, 11)
    xv = rng.standard_normal(shape).astype("float32")
    want = _plain_outputs(f, [xv])
    got = [f([xv]) for _ in range(4)]     # plain, record, bound, bound
    src = _bound_source(f)
    assert src is not None
    assert src.count(" = K") >= 3, src
    for g in got:
        for a, b in zip(g, want):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)


def test_other_shapes_take_the_plain_plan_and_bind_again(bound_plans):
    rng = np.random.default_rng(1)
    x, outs = _net(rng)
    f = K.function([x], outs)
    plan = f._plan(0)
    for batch in (2, 2, 2, 5, 1, 5, 5, 0, 2, 5, 1, 1):
        xv = rng.standard_normal((batch, 9, 11, 6)).astype("float32")
        got = f([xv])
        want = _plain_outputs(f, [xv])
        for a, b in zip(got, want):
            assert a.shape == b.shape
            np.testing.assert_array_equal(a, b)
    # a bound variant per batch size seen twice in a row (0 never binds:
    # its steps have no kernel call)
    assert {key[0][0][0] for key in plan.binding._bound} >= {1, 2, 5}
    assert len(plan.binding._bound) <= binding.BOUND_SHAPES


def test_non_contiguous_feeds_give_the_same_values(bound_plans):
    rng = np.random.default_rng(2)
    x, outs = _net(rng)
    f = K.function([x], outs)
    xv = rng.standard_normal((2, 9, 11, 6)).astype("float32")
    for _ in range(3):
        f([xv])
    wide = np.zeros((2, 9, 22, 6), np.float32)
    wide[:, :, ::2] = xv
    strided = wide[:, :, ::2]
    assert not strided.flags.c_contiguous
    for a, b in zip(f([strided]), _plain_outputs(f, [strided])):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(f([strided]), _plain_outputs(f, [xv])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_new_weights_reach_a_bound_plan(bound_plans):
    rng = np.random.default_rng(3)
    x = K.placeholder((None, 8, 8, 4))
    k = K.variable(rng.standard_normal((3, 3, 4, 5)).astype("float32"))
    b = K.variable(np.zeros(5, "float32"))
    f = K.function([x], [K.relu(K.bias_add(K.conv2d(x, k, padding="same"), b))])
    xv = rng.standard_normal((1, 8, 8, 4)).astype("float32")
    for _ in range(3):
        f([xv])
    assert _bound_source(f) is not None
    K.set_value(k, rng.standard_normal((3, 3, 4, 5)).astype("float32"))
    K.set_value(b, np.full(5, 0.5, "float32"))
    got = f([xv])[0]
    want = _plain_outputs(f, [xv])[0]
    np.testing.assert_array_equal(got, want)
    ref = np.maximum(_conv_same(xv, K.get_value(k)) + 0.5, 0)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def _conv_same(x, k):
    # NumPy reference: 'same' 2-D convolution (cross-correlation), NHWC
    kh, kw = k.shape[:2]
    xp = np.pad(x, ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)))
    out = np.zeros(x.shape[:3] + (k.shape[3],), np.float64)
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nhwc,cf->nhwf", xp[:, i:i + x.shape[1], j:j + x.shape[2]],
                             k[i, j])
    return out


def test_a_failing_bind_hook_leaves_its_step_unbound(bound_plans, monkeypatch):
    def broken(self, inputs):
        raise RuntimeError("bind broke")

    monkeypatch.setattr(conv_ops.Conv, "bind", broken)
    monkeypatch.setattr(conv_ops.PackedConv, "bind", broken)
    rng = np.random.default_rng(4)
    x = K.placeholder((None, 6, 6, 3))
    k = K.variable(rng.standard_normal((3, 3, 3, 4)).astype("float32"))
    y = K.conv2d(x, k, padding="same")
    f = K.function([x], [y, K.pool2d(y, (2, 2), strides=(2, 2))])
    xv = rng.standard_normal((2, 6, 6, 3)).astype("float32")
    want = _plain_outputs(f, [xv])
    for _ in range(3):
        got = f([xv])
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    src = _bound_source(f)
    assert src is not None and "# conv2d" in src
    conv_line = next(line for line in src.splitlines() if "# conv2d" in line)
    assert ", = f" in conv_line        # the conv runs its compute


def test_set_enabled_and_plans_that_do_not_bind():
    previous = binding.set_enabled(False)
    try:
        assert binding.enabled() is False
        x = K.placeholder((None, 3))
        v = K.variable(np.ones(3, "float32"))
        # an updating function never binds
        f = K.function([x], [K.sum(x)], updates=[K.update_add(v, K.mean(x, axis=0))])
        assert f._plan(0).binding is None
        assert binding.set_enabled(True) is False
        for _ in range(3):
            f([np.ones((2, 3), "float32")])
        np.testing.assert_array_equal(K.get_value(v), np.full(3, 4.0, "float32"))
    finally:
        binding.set_enabled(previous)


def test_threads_calling_one_bound_function(bound_plans):
    rng = np.random.default_rng(5)
    x, outs = _net(rng)
    f = K.function([x], outs)
    feeds = {b: rng.standard_normal((b, 9, 11, 6)).astype("float32") for b in (1, 3)}
    want = {b: _plain_outputs(f, [v]) for b, v in feeds.items()}
    errors = []

    def worker(seed):
        r = np.random.default_rng(seed)
        try:
            for _ in range(30):
                b = int(r.choice([1, 3]))
                for a, w in zip(f([feeds[b]]), want[b]):
                    np.testing.assert_array_equal(a, w)
        except Exception as e:      # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_source_variants_share_the_steps():
    steps = [plan_source.StepSource("t1, = f0(t0)", ["t0"], "relu (Unary)", ("op0", None),
                                    bind=lambda arrays: None, fname="f0", out="t1",
                                    args=["t0"]),
             plan_source.StepSource("t2 = np_neg(t1)", [], "neg", ("op1", None))]
    epilogue = ["    return [t2], ()"]
    plain, lines = plan_source.source(["t0"], [], steps, epilogue)
    assert "_binds" not in plain and "K0" not in plain
    assert lines[2] == ("op0", None) and lines[4] == ("op1", None)
    record, _ = plan_source.source(["t0"], [], steps, epilogue, mode="record")
    assert "def run(t0, _binds):" in record and "_binds[0] = _bind(B0, (t0, ))" in record
    bound, lines = plan_source.source(["t0"], [], steps, epilogue, mode="bound",
                                      binds={0: (abs, (0, None), False)},
                                      guard="t0.shape != S0")
    assert "return _plain(t0)" in bound
    assert "t1 = K0(t0, None)" in bound and "t1, = f0(t0)" in bound
    ns = {"K0": lambda a, b: None, "f0": lambda a: (a + 1,), "np_neg": np.negative,
          "S0": (2,), "_plain": lambda t0: "plain"}
    exec(bound, ns)
    # the direct call declined: the step ran its compute
    out = ns["run"](np.zeros(2))[0][0]
    np.testing.assert_array_equal(out, -np.ones(2))
    assert ns["run"](np.zeros(3)) == "plain"


@pytest.mark.parametrize("size", [4, 40])
def test_concatenations_and_sums_of_steps_bind(bound_plans, size):
    # size 40: the concatenations are large enough for the team's copy
    # kernel; size 4: NumPy's concatenate
    rng = np.random.default_rng(6)
    x = K.placeholder((None, size, size, 8))

    def conv(t, cin, cout):
        k = K.variable(rng.standard_normal((1, 1, cin, cout)).astype("float32"))
        return K.relu(K.conv2d(t, k))

    a = conv(x, 8, 8)
    b = conv(x, 8, 8)
    block = K.concatenate([x, a, b], axis=-1)
    block = K.concatenate([block, conv(block, 24, 8)], axis=-1)
    total = conv(block, 32, 8) + a      # a sum of two steps' outputs
    f = K.function([x], [block, total, K.concatenate([a, b], axis=1)])
    xv = rng.standard_normal((1, size, size, 8)).astype("float32")
    want = _plain_outputs(f, [xv])
    for _ in range(3):
        got = f([xv])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(got[0][..., :8], xv)
    src = _bound_source(f)
    concat_lines = [line for line in src.splitlines()
                    if "# concatenate" in line and not line.startswith("        ")]
    assert len(concat_lines) == 3 and all(" = K" in line for line in concat_lines)
    # a feed of another layout: the bound calls decline it, the ops take it
    strided = np.repeat(xv, 2, axis=2)[:, :, ::2]
    for g, w in zip(f([strided]), _plain_outputs(f, [strided])):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("on", [False, True])
def test_feeds_of_any_layout_give_the_same_bits(on):
    # the same values as a strided view or a contiguous array: every step
    # runs the same kernel on them (a packed 1x1 convolution copies a view)
    previous = binding.set_enabled(on)
    try:
        rng = np.random.default_rng(7)
        for h, cin, cout, ks, stride in [(4, 8, 8, 1, 1), (9, 6, 16, 3, 1), (12, 16, 32, 3, 2),
                                         (14, 64, 64, 3, 1)]:
            x = K.placeholder((None, h, h, cin))
            k = K.variable(rng.standard_normal((ks, ks, cin, cout)).astype("float32"))
            kd = K.variable(rng.standard_normal((3, 3, cin, 1)).astype("float32"))
            w = K.variable(rng.standard_normal((cin, 5)).astype("float32"))
            outs = [K.relu(K.conv2d(x, k, strides=(stride, stride), padding="same")),
                    K.depthwise_conv2d(x, kd, padding="same"),
                    K.pool2d(x, (3, 3), (2, 2), "same", pool_mode="avg"),
                    K.dot(x, w)]
            f = K.function([x], outs)
            xv = rng.standard_normal((2, h, h, cin)).astype("float32")
            strided = np.repeat(xv, 2, axis=2)[:, :, ::2]
            for _ in range(3):
                want = f([xv])
            for a, b in zip(f([strided]), want):
                np.testing.assert_array_equal(a, b)
    finally:
        binding.set_enabled(previous)


def test_layer_norm_and_attention_steps_bind(bound_plans):
    from cyback.ops.attention import Attention
    from cyback.ops.normalization import layer_norm
    rng = np.random.default_rng(8)
    x = K.placeholder((None, 6, 3, 12))
    gamma = K.variable(rng.standard_normal(4).astype("float32"))
    beta = K.variable(rng.standard_normal(4).astype("float32"))
    att = Attention()(x[..., :4], x[..., 4:8], x[..., 8:])
    f = K.function([x], [layer_norm(att, gamma, beta), layer_norm(att, None, beta, 1e-5)])
    xv = rng.standard_normal((2, 6, 3, 12)).astype("float32")
    want = _plain_outputs(f, [xv])
    for _ in range(3):
        got = f([xv])
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    src = _bound_source(f)
    for label in ("(Attention)", "(LayerNorm)"):
        lines = [line for line in src.splitlines() if label in line and
                 not line.startswith("        ")]
        assert lines and all(" = K" in line for line in lines), src


def test_a_deleted_function_frees_its_plan_at_once(bound_plans):
    # no reference cycle through the bound variants: the plan and its frozen
    # weights go with the function, not at the next garbage collection
    import gc
    import weakref
    rng = np.random.default_rng(9)
    x, outs = _net(rng)
    f = K.function([x], outs)
    xv = rng.standard_normal((1, 9, 11, 6)).astype("float32")
    for _ in range(3):
        f([xv])
    assert _bound_source(f) is not None
    plan = weakref.ref(f._plan(0))
    gc.disable()
    try:
        del f
        assert plan() is None
    finally:
        gc.enable()


def test_new_weights_record_the_steps_again(bound_plans):
    rng = np.random.default_rng(10)
    x = K.placeholder((None, 8, 8, 4))
    k = K.variable(rng.standard_normal((3, 3, 4, 5)).astype("float32"))
    f = K.function([x], [K.conv2d(x, k, padding="same")])
    xv = rng.standard_normal((1, 8, 8, 4)).astype("float32")
    for _ in range(3):
        f([xv])
    first = f._plan(0).binding.run
    K.set_value(k, rng.standard_normal((3, 3, 4, 5)).astype("float32"))
    for _ in range(3):
        got = f([xv])[0]
    binding_ = f._plan(0).binding
    assert binding_.run is not first and binding_.source() is not None
    np.testing.assert_array_equal(got, _plain_outputs(f, [xv])[0])
    # the variants' file names differ: an error is traced to its own lines
    names = [n for n in f._plan(0).sources if " bound " in n]
    assert len(names) == len(set(names)) >= 2
