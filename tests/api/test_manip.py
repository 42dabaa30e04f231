"""Shape manipulation and indexing: values against NumPy references, static
shapes, symbolic (None) sizes, gradients and argument errors."""
import numpy as np
import pytest

import cyback as K

from gradcheck import check_grads

FLOATS = ["float32", "float64"]


def run(build, *values, shapes=None, dtypes=None):
    """Build ``build(*placeholders)`` with placeholders of ``shapes`` (None
    sizes allowed; default: the values' shapes) and run it on ``values``."""
    shapes = shapes or [np.shape(v) for v in values]
    dtypes = dtypes or [np.asarray(v).dtype.name for v in values]
    phs = [K.placeholder(shape=s, dtype=d) for s, d in zip(shapes, dtypes)]
    out = build(*phs)
    outs = out if isinstance(out, (list, tuple)) else [out]
    res = K.function(phs, list(outs))(list(values))
    return (res if isinstance(out, (list, tuple)) else res[0]), out


def rand(rng, *shape, dtype="float64"):
    return rng.standard_normal(shape).astype(dtype)


# ------------------------------------------------------------------ gather

@pytest.mark.parametrize("dtype", FLOATS)
def test_gather_values_and_shapes(rng, dtype):
    ref = rand(rng, 5, 3, dtype=dtype)
    for idx in (np.array([4, 0, 0, 2]), np.array([[1, 2], [3, -1]]), np.array(3),
                np.zeros((0,), "int64")):
        got, out = run(K.gather, ref, idx.astype("int32"))
        np.testing.assert_array_equal(got, ref[idx])
        assert got.dtype == dtype
        assert K.int_shape(out) == idx.shape + (3,)


def test_gather_symbolic_indices_and_seed_example():
    v = K.variable(np.arange(12.).reshape(3, 4))
    np.testing.assert_array_equal(K.eval(K.gather(v, [2, 0])), [[8, 9, 10, 11], [0, 1, 2, 3]])
    idx = K.placeholder((None, None), dtype="int32")
    out = K.gather(v, idx)
    assert K.int_shape(out) == (None, None, 4)
    got = K.function([idx], [out])([np.array([[1], [2]])])[0]
    np.testing.assert_array_equal(got, np.arange(12.).reshape(3, 4)[[[1], [2]]])


def test_gather_gradient_with_repeated_indices(rng):
    idx = K.constant([[1, 3, 1], [0, 1, 3]], dtype="int32")
    check_grads(lambda r: K.gather(r, idx), rand(rng, 4, 2))
    # Second derivative through the scatter-add.
    ref = K.placeholder((4, 2), dtype="float64")
    g, = K.gradients(K.sum(K.square(K.gather(ref, idx))), [ref])
    gg, = K.gradients(K.sum(g * g), [ref])
    r = rand(rng, 4, 2)
    counts = np.bincount([1, 3, 1, 0, 1, 3], minlength=4)[:, None]
    np.testing.assert_allclose(K.function([ref], [gg])([r])[0], 8 * counts ** 2 * r)


def test_gather_errors():
    v = K.variable(np.zeros((3, 2)))
    with pytest.raises(TypeError, match="gather.*integer"):
        K.gather(v, K.constant([0.0, 1.0]))
    with pytest.raises(ValueError, match="gather.*scalar"):
        K.gather(K.constant(1.0), [0])
    with pytest.raises(ValueError, match="gather: index -4 is out of range.*\\(3, 2\\)"):
        K.gather(v, [0, -4])
    idx = K.placeholder((None,), dtype="int32")
    f = K.function([idx], [K.gather(v, idx)])
    with pytest.raises(ValueError, match="gather: index 3 is out of range"):
        f([np.array([0, 3])])


# ------------------------------------------------------------------ concatenate / stack

@pytest.mark.parametrize("dtype", FLOATS)
def test_concatenate(rng, dtype):
    a, b = rand(rng, 2, 3, dtype=dtype), rand(rng, 2, 1, dtype=dtype)
    got, out = run(lambda x, y: K.concatenate([x, y]), a, b, shapes=[(None, 3), (None, 1)])
    np.testing.assert_array_equal(got, np.concatenate([a, b], -1))
    assert K.int_shape(out) == (None, 4)
    got, out = run(lambda x, y: K.concatenate([x, y], axis=0), a, a)
    np.testing.assert_array_equal(got, np.concatenate([a, a], 0))
    assert K.int_shape(out) == (4, 3)
    # Mixed dtypes are promoted.
    c = K.concatenate([K.constant([1, 2], dtype="int32"), K.constant([0.5], dtype=dtype)])
    assert K.dtype(c) == dtype
    check_grads(lambda x, y: K.concatenate([x, y], axis=1), rand(rng, 2, 3), rand(rng, 2, 1))


def test_concatenate_errors():
    a, b = K.placeholder((2, 3)), K.placeholder((3, 3))
    with pytest.raises(ValueError, match="concatenate"):
        K.concatenate([a, b], axis=1)
    with pytest.raises(ValueError, match="concatenate.*rank"):
        K.concatenate([a, K.placeholder((2, 3, 1))])
    with pytest.raises(ValueError, match="concatenate.*axis 2"):
        K.concatenate([a, a], axis=2)
    with pytest.raises(ValueError, match="concatenate.*empty"):
        K.concatenate([])
    with pytest.raises(TypeError, match="concatenate.*list"):
        K.concatenate(a)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_stack(rng, axis):
    a, b = rand(rng, 2, 3), rand(rng, 2, 3)
    got, out = run(lambda x, y: K.stack([x, y], axis=axis), a, b, shapes=[(None, 3)] * 2)
    ref = np.stack([a, b], axis=axis)
    np.testing.assert_array_equal(got, ref)
    expect = [None, 3]
    expect.insert(axis % 3, 2)
    assert K.int_shape(out) == tuple(expect)
    check_grads(lambda x, y: K.stack([x, y], axis=axis), a, b)


def test_stack_scalars_as_shape_and_errors():
    x = K.placeholder((None, 4))
    s = K.stack([K.shape(x)[0], 2, 2])
    out = K.reshape(x, s)
    assert K.int_shape(out) == (None, 2, 2)
    assert K.function([x], [out])([np.zeros((3, 4))])[0].shape == (3, 2, 2)
    with pytest.raises(ValueError, match="stack.*same shape"):
        K.stack([K.placeholder((2, 3)), K.placeholder((3, 3))])
    with pytest.raises(ValueError, match="stack.*axis"):
        K.stack([x, x], axis=3)
    with pytest.raises(ValueError, match="stack.*empty"):
        K.stack([])


# ------------------------------------------------------------------ reshape family

@pytest.mark.parametrize("dtype", FLOATS)
def test_reshape(rng, dtype):
    a = rand(rng, 3, 4, 5, dtype=dtype)
    got, out = run(lambda x: K.reshape(x, (-1, 5)), a)
    np.testing.assert_array_equal(got, a.reshape(-1, 5))
    assert K.int_shape(out) == (12, 5)
    got, out = run(lambda x: K.reshape(x, (K.shape(x)[0], -1)), a, shapes=[(None, 4, 5)])
    np.testing.assert_array_equal(got, a.reshape(3, 20))
    assert K.int_shape(out) == (None, 20)
    got, out = run(lambda x: K.reshape(x, (K.shape(x)[0], 2, K.shape(x)[1] // 2, 5)), a,
                   shapes=[(None, None, 5)])
    np.testing.assert_array_equal(got, a.reshape(3, 2, 2, 5))
    assert K.int_shape(out) == (None, 2, None, 5)
    check_grads(lambda x: K.reshape(x, (2, -1)), rand(rng, 3, 2))


def test_reshape_errors():
    x = K.placeholder((3, 4))
    with pytest.raises(ValueError, match="reshape.*\\(3, 4\\).*\\(5, -1\\)"):
        K.reshape(x, (5, -1))
    with pytest.raises(ValueError, match="reshape.*12 elements"):
        K.reshape(x, (5, 2))
    with pytest.raises(ValueError, match="reshape.*-1"):
        K.reshape(x, (-1, -1))
    with pytest.raises(TypeError, match="reshape"):
        K.reshape(x, "3,4")
    y = K.placeholder((None, 4))
    f = K.function([y], [K.reshape(y, (K.shape(y)[0], 3))])
    with pytest.raises(ValueError, match="reshape"):
        f([np.zeros((2, 4))])


def test_permute_dimensions(rng):
    a = rand(rng, 2, 3, 4)
    got, out = run(lambda x: K.permute_dimensions(x, (2, 0, 1)), a, shapes=[(None, 3, 4)])
    np.testing.assert_array_equal(got, a.transpose(2, 0, 1))
    assert K.int_shape(out) == (4, None, 3)
    check_grads(lambda x: K.permute_dimensions(x, [1, 2, 0]), a)
    with pytest.raises(ValueError, match="permute_dimensions.*\\(0, 0, 1\\)"):
        K.permute_dimensions(K.placeholder((2, 3, 4)), (0, 0, 1))
    with pytest.raises(ValueError, match="permute_dimensions"):
        K.permute_dimensions(K.placeholder((2, 3, 4)), (0, 1))


def test_flatten_and_batch_flatten(rng):
    a = rand(rng, 3, 2, 4)
    got, out = run(K.flatten, a, shapes=[(None, 2, 4)])
    np.testing.assert_array_equal(got, a.ravel())
    assert K.int_shape(out) == (None,)
    assert K.int_shape(K.flatten(K.placeholder((3, 2, 4)))) == (24,)
    got, out = run(K.batch_flatten, a, shapes=[(None, 2, 4)])
    np.testing.assert_array_equal(got, a.reshape(3, 8))
    assert K.int_shape(out) == (None, 8)
    # Empty batch and 1-D input.
    got, _ = run(K.batch_flatten, np.zeros((0, 2, 4)), shapes=[(None, 2, 4)])
    assert got.shape == (0, 8)
    got, out = run(K.batch_flatten, np.arange(3.0))
    assert got.shape == (3, 1) and K.int_shape(out) == (3, 1)
    assert K.int_shape(K.batch_flatten(K.placeholder((None, None, 3)))) == (None, None)
    check_grads(K.batch_flatten, a)
    check_grads(K.flatten, a)
    with pytest.raises(ValueError, match="batch_flatten.*scalar"):
        K.batch_flatten(K.constant(1.0))


def test_expand_dims_and_squeeze(rng):
    a = rand(rng, 2, 3)
    for axis in (-1, 0, 1, 2, -3):
        got, out = run(lambda x: K.expand_dims(x, axis), a, shapes=[(None, 3)])
        np.testing.assert_array_equal(got, np.expand_dims(a, axis))
        assert K.ndim(out) == 3
    assert K.int_shape(K.expand_dims(K.placeholder((None, 3)))) == (None, 3, 1)
    b = a[:, None, :]
    got, out = run(lambda x: K.squeeze(x, 1), b, shapes=[(None, 1, 3)])
    np.testing.assert_array_equal(got, a)
    assert K.int_shape(out) == (None, 3)
    check_grads(lambda x: K.expand_dims(x, 1), a)
    check_grads(lambda x: K.squeeze(x, -2), b)
    with pytest.raises(ValueError, match="expand_dims.*3"):
        K.expand_dims(K.placeholder((2, 3)), 3)
    with pytest.raises(ValueError, match="squeeze.*size 3"):
        K.squeeze(K.placeholder((2, 3)), 1)
    with pytest.raises(ValueError, match="squeeze.*out of range"):
        K.squeeze(K.placeholder((2, 1)), 2)
    x = K.placeholder((2, None))
    f = K.function([x], [K.squeeze(x, 1)])
    with pytest.raises(ValueError, match="squeeze"):
        f([np.zeros((2, 2))])


# ------------------------------------------------------------------ repeating

@pytest.mark.parametrize("dtype", FLOATS)
def test_repeat_elements(rng, dtype):
    a = rand(rng, 2, 3, 2, dtype=dtype)
    for rep, axis in ((2, 1), (3, -1), (0, 0), (1, 2)):
        got, out = run(lambda x: K.repeat_elements(x, rep, axis), a, shapes=[(None, 3, 2)])
        np.testing.assert_array_equal(got, np.repeat(a, rep, axis))
        expect = list(np.repeat(a, rep, axis).shape)
        if axis % 3 == 0:
            expect[0] = 0 if rep == 0 else None
        else:
            expect[0] = None
        assert K.int_shape(out) == tuple(expect)
    check_grads(lambda x: K.repeat_elements(x, 3, 1), a.astype("float64"))
    with pytest.raises(ValueError, match="repeat_elements.*rep"):
        K.repeat_elements(K.placeholder((2, 3)), -1, 0)
    with pytest.raises(TypeError, match="repeat_elements.*rep"):   # ints only, as TF
        K.repeat_elements(K.placeholder((2, 3)), 1.5, 0)
    with pytest.raises(TypeError, match="repeat_elements.*rep"):
        K.repeat_elements(K.placeholder((2, 3)), "2", 0)
    with pytest.raises(ValueError, match="repeat_elements.*axis"):
        K.repeat_elements(K.placeholder((2, 3)), 2, 2)


def test_repeat(rng):
    a = rand(rng, 4, 3)
    got, out = run(lambda x: K.repeat(x, 2), a, shapes=[(None, 3)])
    np.testing.assert_array_equal(got, np.repeat(a[:, None, :], 2, axis=1))
    assert K.int_shape(out) == (None, 2, 3)
    check_grads(lambda x: K.repeat(x, 3), a)
    with pytest.raises(ValueError, match="repeat.*2-D"):
        K.repeat(K.placeholder((2, 3, 4)), 2)


def test_tile(rng):
    a = rand(rng, 2, 3)
    got, out = run(lambda x: K.tile(x, [2, 3]), a, shapes=[(None, 3)])
    np.testing.assert_array_equal(got, np.tile(a, (2, 3)))
    assert K.int_shape(out) == (None, 9)
    np.testing.assert_array_equal(K.eval(K.tile(K.constant([1, 2], dtype="int32"), 2)),
                                  [1, 2, 1, 2])
    # A count known only at run time.
    y = K.placeholder((None, 5))
    x = K.placeholder((1, 3), dtype="float64")
    t = K.tile(x, [K.shape(y)[0], 1])
    assert K.int_shape(t) == (None, 3)
    got = K.function([x, y], [t])([a[:1], np.zeros((4, 5))])[0]
    np.testing.assert_array_equal(got, np.tile(a[:1], (4, 1)))
    g, = K.gradients(K.sum(t * K.constant(np.arange(3.0), dtype="float64")), [x])
    assert K.int_shape(g) == (1, 3)
    np.testing.assert_array_equal(K.function([x, y], [g])([a[:1], np.zeros((4, 5))])[0],
                                  [[0, 4, 8]])
    check_grads(lambda v: K.tile(v, [3, 2]), a)
    check_grads(lambda v: K.tile(v, (1, 0)), a)
    with pytest.raises(ValueError, match="tile.*3 entries.*rank 2"):
        K.tile(K.placeholder((3, 4)), [2, 2, 2])
    with pytest.raises(ValueError, match="tile.*negative"):
        K.tile(K.placeholder((2, 3)), [2, -1])


@pytest.mark.parametrize("shape,n", [((3, 4), 2), ((3, 4), (2, 1)), ((3, 4, 5), 2),
                                     ((3, 4, 5), (1, 2)), ((3, 4, 5), (3, 1, 2)),
                                     ((2, 1, 3), np.array([2, 3]))])
def test_tile_fewer_counts_than_axes_tile_the_last_axes(rng, shape, n):
    """NumPy's (and Theano's) rule, which Keras's backend tests check."""
    a = rand(rng, *shape)
    a = a.astype("float32")
    np.testing.assert_array_equal(K.eval(K.tile(K.constant(a), n)), np.tile(a, n))
    # The same with the counts in a tensor known only at run time.
    counts = K.placeholder((np.size(n),), dtype="int32")
    t = K.tile(K.constant(a), counts)
    assert t.ndim == a.ndim
    got = K.function([counts], [t])([np.atleast_1d(n).astype("int32")])[0]
    np.testing.assert_array_equal(got, np.tile(a, n))


def test_repeat_elements_sets_keras_shape():
    y = K.repeat_elements(K.placeholder((2, None, 4)), 3, axis=0)
    assert y._keras_shape == (6, None, 4) == K.int_shape(y)


def test_arange():
    # The seed's Theano convention: one argument is the stop.
    np.testing.assert_array_equal(K.eval(K.arange(5)), np.arange(5))
    assert K.dtype(K.arange(5)) == "int32"
    np.testing.assert_array_equal(K.eval(K.arange(2, 8, 2)), [2, 4, 6])
    np.testing.assert_array_equal(K.eval(K.arange(5, 0, -2)), [5, 3, 1])
    assert K.eval(K.arange(-3)).shape == (0,)
    np.testing.assert_array_equal(K.eval(K.arange(0, 1, 0.25, dtype="float32")),
                                  [0, 0.25, 0.5, 0.75])
    assert K.dtype(K.arange(3, dtype="int64")) == "int64"
    x = K.placeholder((None, 2))
    r = K.arange(K.shape(x)[0])
    assert K.int_shape(r) == (None,)
    assert K.function([x], [r])([np.zeros((4, 2))])[0].tolist() == [0, 1, 2, 3]
    r = K.arange(1, K.shape(x)[0] * 2, 3)
    assert K.function([x], [r])([np.zeros((4, 2))])[0].tolist() == [1, 4, 7]
    with pytest.raises(ValueError, match="arange.*step"):
        K.arange(0, 3, 0)
    with pytest.raises(TypeError, match="arange.*stop"):
        K.arange("3")
    with pytest.raises(TypeError, match="arange.*start"):
        K.arange(None, 3)
    with pytest.raises(ValueError, match="arange.*stop.*scalar"):
        K.arange(0, K.placeholder((2,)))


# ------------------------------------------------------------------ resizing

def np_bilinear_axis(x, f, axis):
    """TensorFlow's legacy resize_bilinear along one axis, one row at a time."""
    n = x.shape[axis]
    rows = []
    for y in range(n * f):
        src = y / f
        lo = int(np.floor(src))
        hi = min(lo + 1, n - 1)
        t = src - lo
        a, b = np.take(x, lo, axis=axis), np.take(x, hi, axis=axis)
        rows.append(a + (b - a) * t)
    return np.stack(rows, axis=axis)


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_resize_images_nearest(rng, data_format, dtype):
    a = rand(rng, 2, 3, 4, 5, dtype=dtype)
    rows, cols = (2, 3) if data_format == "channels_first" else (1, 2)
    shape = [None] * 4
    shape[rows] = a.shape[rows]
    got, out = run(lambda x: K.resize_images(x, 2, 3, data_format), a, shapes=[tuple(shape)])
    ref = np.repeat(np.repeat(a, 2, rows), 3, cols)
    np.testing.assert_array_equal(got, ref)
    expect = [None] * 4
    expect[rows] = a.shape[rows] * 2
    assert K.int_shape(out) == tuple(expect)
    check_grads(lambda x: K.resize_images(x, 2, 3, data_format), a[:1, :2, :2, :3])


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_resize_images_bilinear(rng, data_format, dtype):
    a = rand(rng, 2, 3, 4, 2, dtype=dtype)
    rows, cols = (2, 3) if data_format == "channels_first" else (1, 2)
    got, out = run(lambda x: K.resize_images(x, 3, 2, data_format, interpolation="bilinear"),
                   a, shapes=[(None,) * 4])
    ref = np_bilinear_axis(np_bilinear_axis(a.astype("float64"), 2, cols), 3, rows)
    np.testing.assert_allclose(got, ref, rtol=1e-5 if dtype == "float32" else 1e-12,
                               atol=1e-6 if dtype == "float32" else 1e-14)
    assert got.dtype == dtype
    assert K.int_shape(out) == (None,) * 4
    x = K.placeholder((None, 3, 4, 2) if data_format == "channels_last" else (None, 2, 3, 4))
    assert K.int_shape(K.resize_images(x, 2, 2, data_format, "bilinear"))[rows:cols + 1] == \
        (6, 8)
    check_grads(lambda v: K.resize_images(v, 3, 2, data_format, interpolation="bilinear"),
                a[:1, :3, :3, :2].astype("float64"))


def test_resize_images_bilinear_tf_example():
    img = np.arange(4.0).reshape(1, 2, 2, 1)
    got = K.eval(K.resize_images(K.constant(img), 2, 2, "channels_last", "bilinear"))
    np.testing.assert_allclose(got[0, :, :, 0], [[0, 0.5, 1, 1], [1, 1.5, 2, 2],
                                                 [2, 2.5, 3, 3], [2, 2.5, 3, 3]])
    # Second derivative through the adjoint pair.
    x = K.placeholder((1, 2, 3, 1), dtype="float64")
    y = K.resize_images(x, 2, 2, "channels_last", "bilinear")
    g, = K.gradients(K.sum(K.square(y)), [x])
    gg, = K.gradients(K.sum(g), [x])
    assert K.function([x], [gg])([np.ones((1, 2, 3, 1))])[0].shape == (1, 2, 3, 1)


def np_half_pixel_axis(x, f, axis):
    """TF 2's bilinear resize (half-pixel centres) along one axis, row by row."""
    n = x.shape[axis]
    rows = []
    for y in range(n * f):
        src = max((y + 0.5) / f - 0.5, 0.0)
        lo = int(np.floor(src))
        hi = min(lo + 1, n - 1)
        t = src - lo
        a, b = np.take(x, lo, axis=axis), np.take(x, hi, axis=axis)
        rows.append(a + (b - a) * t)
    return np.stack(rows, axis=axis)


@pytest.fixture
def half_pixel():
    K.set_resize_half_pixel_centers(True)
    yield
    K.set_resize_half_pixel_centers(False)


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n_rows", [1, 3])
def test_resize_images_bilinear_half_pixel(rng, half_pixel, data_format, dtype, n_rows):
    assert K.resize_half_pixel_centers()
    a = rand(rng, 2, n_rows, 4, 2, dtype=dtype)
    if data_format == "channels_first":
        a = np.ascontiguousarray(a.transpose(0, 3, 1, 2))
    rows, cols = (2, 3) if data_format == "channels_first" else (1, 2)
    got, _ = run(lambda x: K.resize_images(x, 3, 2, data_format, interpolation="bilinear"),
                 a, shapes=[(None,) * 4])
    ref = np_half_pixel_axis(np_half_pixel_axis(a.astype("float64"), 2, cols), 3, rows)
    np.testing.assert_allclose(got, ref, rtol=1e-5 if dtype == "float32" else 1e-12,
                               atol=1e-6 if dtype == "float32" else 1e-14)
    assert got.dtype == dtype
    check_grads(lambda v: K.resize_images(v, 3, 2, data_format, interpolation="bilinear"),
                a[:1].astype("float64"))


def test_resize_images_bilinear_half_pixel_tf2_example(half_pixel):
    # tf.image.resize([[0, 1], [2, 3]], (4, 4)) in TF 2.
    img = np.arange(4.0).reshape(1, 2, 2, 1)
    got = K.eval(K.resize_images(K.constant(img), 2, 2, "channels_last", "bilinear"))
    np.testing.assert_allclose(got[0, :, :, 0], [[0, 0.25, 0.75, 1], [0.5, 0.75, 1.25, 1.5],
                                                 [1.5, 1.75, 2.25, 2.5], [2, 2.25, 2.75, 3]])
    # Nearest is unchanged, and the setting is a bool.
    near = K.eval(K.resize_images(K.constant(img), 2, 2, "channels_last"))
    np.testing.assert_array_equal(near, np.repeat(np.repeat(img, 2, 1), 2, 2))
    with pytest.raises(TypeError, match="set_resize_half_pixel_centers"):
        K.set_resize_half_pixel_centers("yes")


def test_resize_half_pixel_centers_is_off_by_default():
    assert not K.resize_half_pixel_centers()


def test_resize_images_errors():
    x = K.placeholder((1, 2, 2, 1))
    with pytest.raises(ValueError, match="data_format"):
        K.resize_images(x, 2, 2, "channels_middle")
    with pytest.raises(ValueError, match="resize_images.*height_factor"):
        K.resize_images(x, 0, 2, "channels_last")
    with pytest.raises(TypeError, match="resize_images.*width_factor"):
        K.resize_images(x, 2, 1.5, "channels_last")
    with pytest.raises(ValueError, match="resize_images.*interpolation"):
        K.resize_images(x, 2, 2, "channels_last", interpolation="bicubic")
    with pytest.raises(ValueError, match="resize_images.*4-D"):
        K.resize_images(K.placeholder((2, 2, 1)), 2, 2, "channels_last")


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first", None])
def test_resize_volumes(rng, data_format):
    a = rand(rng, 1, 2, 3, 2, 2)
    axes = (2, 3, 4) if data_format == "channels_first" else (1, 2, 3)
    got, out = run(lambda x: K.resize_volumes(x, 2, 1, 3, data_format), a)
    ref = np.repeat(np.repeat(a, 2, axes[0]), 3, axes[2])
    np.testing.assert_array_equal(got, ref)
    assert K.int_shape(out) == ref.shape
    check_grads(lambda x: K.resize_volumes(x, 2, 2, 1, data_format), a)
    with pytest.raises(ValueError, match="resize_volumes.*5-D"):
        K.resize_volumes(K.placeholder((1, 2, 2, 1)), 2, 2, 2, data_format)
    with pytest.raises(ValueError, match="data_format"):
        K.resize_volumes(K.placeholder((1, 2, 2, 2, 1)), 2, 2, 2, "nchw")


# ------------------------------------------------------------------ padding

@pytest.mark.parametrize("dtype", FLOATS)
def test_temporal_padding(rng, dtype):
    a = rand(rng, 2, 3, 4, dtype=dtype)
    got, out = run(K.temporal_padding, a, shapes=[(None, None, 4)])
    np.testing.assert_array_equal(got, np.pad(a, ((0, 0), (1, 1), (0, 0))))
    assert K.int_shape(out) == (None, None, 4)
    got, out = run(lambda x: K.temporal_padding(x, (0, 2)), a)
    np.testing.assert_array_equal(got, np.pad(a, ((0, 0), (0, 2), (0, 0))))
    assert K.int_shape(out) == (2, 5, 4)
    check_grads(lambda x: K.temporal_padding(x, (2, 1)), a.astype("float64"))
    with pytest.raises(ValueError, match="temporal_padding.*3-D"):
        K.temporal_padding(K.placeholder((2, 3)))
    with pytest.raises(ValueError, match="temporal_padding.*padding"):
        K.temporal_padding(K.placeholder((2, 3, 4)), (1, -1))
    with pytest.raises(ValueError, match="temporal_padding.*padding"):
        K.temporal_padding(K.placeholder((2, 3, 4)), (1, 1, 1))


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_spatial_2d_padding(rng, data_format):
    a = rand(rng, 2, 3, 4, 5)
    pad = ((1, 2), (0, 3))
    got, out = run(lambda x: K.spatial_2d_padding(x, pad, data_format), a,
                   shapes=[(None, 3, 4, 5)])
    full = ((0, 0), (0, 0)) + pad if data_format == "channels_first" else \
        ((0, 0),) + pad + ((0, 0),)
    np.testing.assert_array_equal(got, np.pad(a, full))
    assert K.int_shape(out) == (None,) + np.pad(a, full).shape[1:]
    check_grads(lambda x: K.spatial_2d_padding(x, pad, data_format), a[:1, :2, :3, :2])
    with pytest.raises(ValueError, match="spatial_2d_padding.*4-D"):
        K.spatial_2d_padding(K.placeholder((2, 3, 4)))
    with pytest.raises(ValueError, match="spatial_2d_padding.*padding"):
        K.spatial_2d_padding(K.placeholder((2, 3, 4, 5)), ((1, 1),))
    with pytest.raises(ValueError, match="data_format"):
        K.spatial_2d_padding(K.placeholder((2, 3, 4, 5)), data_format="nhwc")


def test_spatial_2d_padding_default_format(rng):
    a = rand(rng, 1, 2, 2, 1, dtype="float32")
    K.set_image_data_format("channels_first")
    np.testing.assert_array_equal(K.eval(K.spatial_2d_padding(K.constant(a))),
                                  np.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1))))
    K.set_image_data_format("channels_last")
    np.testing.assert_array_equal(K.eval(K.spatial_2d_padding(K.constant(a))),
                                  np.pad(a, ((0, 0), (1, 1), (1, 1), (0, 0))))


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_spatial_3d_padding(rng, data_format):
    a = rand(rng, 1, 2, 3, 2, 2)
    pad = ((1, 0), (0, 2), (1, 1))
    got, out = run(lambda x: K.spatial_3d_padding(x, pad, data_format), a)
    full = ((0, 0), (0, 0)) + pad if data_format == "channels_first" else \
        ((0, 0),) + pad + ((0, 0),)
    np.testing.assert_array_equal(got, np.pad(a, full))
    assert K.int_shape(out) == np.pad(a, full).shape
    check_grads(lambda x: K.spatial_3d_padding(x, pad, data_format), a)
    with pytest.raises(ValueError, match="spatial_3d_padding.*5-D"):
        K.spatial_3d_padding(K.placeholder((2, 3, 4, 5)))


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_padding_writes_every_border_cell_over_reused_memory(rng, dtype):
    # the padded array is allocated uninitialised and only its border zeroed:
    # memory just freed full of other values must not show through
    cases = [((2, 5, 7, 3), ((0, 0), (2, 1), (0, 3), (0, 0))),
             ((1, 4, 4, 2), ((0, 0), (0, 1), (0, 1), (0, 0))),
             ((3, 0, 2, 2), ((0, 0), (1, 1), (1, 0), (0, 0))),
             ((0, 3, 3, 1), ((0, 0), (1, 1), (1, 1), (0, 0)))]
    for shape, pads in cases:
        x = (rng.standard_normal(shape) * 10).astype(dtype)
        padded = tuple(d + b + a for d, (b, a) in zip(shape, pads))
        for _ in range(3):
            junk = np.full(padded, 7, dtype)
            del junk
            got = K.eval(K.spatial_2d_padding(K.constant(x, dtype=dtype), pads[1:3],
                                              "channels_last"))
            np.testing.assert_array_equal(got, np.pad(x, pads))


# ------------------------------------------------------------------ one_hot, reverse, slice

def test_one_hot():
    idx = np.array([[0, 2], [1, 5]], dtype="int32")
    got, out = run(lambda i: K.one_hot(i, 3), idx, shapes=[(None, 2)])
    ref = np.zeros((2, 2, 3), "float32")
    ref[0, 0, 0] = ref[0, 1, 2] = ref[1, 0, 1] = 1  # 5 is out of range: a zero row
    np.testing.assert_array_equal(got, ref)
    assert got.dtype == np.float32 and K.dtype(out) == "float32"
    assert K.int_shape(out) == (None, 2, 3)
    np.testing.assert_array_equal(K.eval(K.one_hot(K.constant([-1, 1], dtype="int64"), 2)),
                                  [[0, 0], [0, 1]])
    with pytest.raises(TypeError, match="one_hot.*integer"):
        K.one_hot(K.constant([0.0, 1.0]), 2)
    with pytest.raises(ValueError, match="one_hot.*num_classes"):
        K.one_hot(K.constant([0], dtype="int32"), -1)


def test_reverse(rng):
    a = rand(rng, 2, 3, 4)
    for axes in (0, -1, [0, 2], (1,), []):
        got, out = run(lambda x: K.reverse(x, axes), a, shapes=[(None, 3, 4)])
        ax = [axes] if isinstance(axes, int) else list(axes)
        np.testing.assert_array_equal(got, np.flip(a, ax) if ax else a)
        assert K.int_shape(out) == (None, 3, 4)
    check_grads(lambda x: K.reverse(x, [1, 2]), a)
    with pytest.raises(ValueError, match="reverse.*3"):
        K.reverse(K.placeholder((2, 3, 4)), 3)
    with pytest.raises(ValueError, match="reverse.*repeated"):
        K.reverse(K.placeholder((2, 3, 4)), [1, -2])


def test_slice(rng):
    a = rand(rng, 4, 5, 3)
    got, out = run(lambda x: K.slice(x, [1, 0, 1], [2, -1, 2]), a)
    np.testing.assert_array_equal(got, a[1:3, 0:, 1:3])
    assert K.int_shape(out) == (2, 5, 2)
    got, out = run(lambda x: K.slice(x, [1, 2, 0], [-1, 2, 3]), a, shapes=[(None, 5, 3)])
    np.testing.assert_array_equal(got, a[1:, 2:4, :])
    assert K.int_shape(out) == (None, 2, 3)
    # Symbolic start and size.
    x = K.placeholder((None, 5, 3), dtype="float64")
    out = K.slice(x, [0, K.shape(x)[1] - 2, 0], [K.shape(x)[0] - 1, 2, -1])
    assert K.int_shape(out) == (None, 2, 3)
    got = K.function([x], [out])([a])[0]
    np.testing.assert_array_equal(got, a[0:3, 3:5, :])
    check_grads(lambda v: K.slice(v, [1, 1, 0], [2, 3, -1]), a)
    g, = K.gradients(K.sum(out), [x])
    np.testing.assert_array_equal(K.function([x], [g])([a])[0],
                                  np.pad(np.ones((3, 2, 3)), ((0, 1), (3, 0), (0, 0))))


def test_slice_errors():
    x = K.placeholder((4, 5))
    with pytest.raises(ValueError, match="slice.*one entry per axis"):
        K.slice(x, [0], [1])
    with pytest.raises(ValueError, match="slice.*out of range"):
        K.slice(x, [3, 0], [2, 1])
    with pytest.raises(ValueError, match="slice.*negative"):
        K.slice(x, [-1, 0], [1, 1])
    with pytest.raises(ValueError, match="slice.*size"):
        K.slice(x, [0, 0], [1, -2])
    y = K.placeholder((None, 5))
    f = K.function([y], [K.slice(y, [1, 0], [3, 5])])
    with pytest.raises(ValueError, match="slice.*out of range"):
        f([np.zeros((2, 5))])


def test_pattern_broadcast(rng):
    a = rand(rng, 3, 1, dtype="float32")
    x = K.placeholder((3, 1))
    assert K.pattern_broadcast(x, [False, True]) is x
    y = K.placeholder((None, None))
    out = K.pattern_broadcast(y, [False, True])
    assert K.int_shape(out) == (None, 1)
    np.testing.assert_array_equal(K.function([y], [out])([a])[0], a)
    check_grads(lambda v: K.pattern_broadcast(v, (False, True)) * 2, a)
    with pytest.raises(ValueError, match="pattern_broadcast.*axis 0"):
        K.pattern_broadcast(x, [True, True])
    with pytest.raises(ValueError, match="pattern_broadcast.*entries"):
        K.pattern_broadcast(x, [True])
    with pytest.raises(ValueError, match="pattern_broadcast"):
        K.function([y], [out])([np.zeros((2, 2))])


# ------------------------------------------------------------------ second derivatives

SECOND_ORDER = {
    "gather": lambda x: K.gather(x, K.constant([2, 0, 2], dtype="int32")),
    "tile": lambda x: K.tile(x, [2, 1, 2]),
    "tile_symbolic": lambda x: K.tile(x, [K.shape(x)[1], 1, 1]),
    "repeat_elements": lambda x: K.repeat_elements(x, 2, 1),
    "pad": lambda x: K.temporal_padding(x, (1, 2)),
    "reverse": lambda x: K.reverse(x, [0, 2]),
    "slice": lambda x: K.slice(x, [1, 0, K.shape(x)[2] - 2], [-1, 1, 2]),
    "squeeze": lambda x: K.squeeze(x[:, :1], 1),
    "bilinear": lambda x: K.resize_images(x[..., None], 2, 3, "channels_last", "bilinear"),
    "batch_flatten": K.batch_flatten,
    "stack": lambda x: K.stack([x, 2 * x], axis=-1),
}


@pytest.mark.parametrize("name", sorted(SECOND_ORDER))
def test_second_derivatives(rng, name):
    f = SECOND_ORDER[name]

    def grad_of(x):
        y = f(x)
        w = K.constant(np.linspace(0.5, 1.5, int(np.prod(K.int_shape(y)))).reshape(
            K.int_shape(y)), dtype="float64")
        g, = K.gradients(K.sum(K.square(y) * w * x[0, 0, 0]), [x])
        return g

    check_grads(grad_of, rand(rng, 3, 2, 3), rtol=1e-4, atol=1e-6)
