"""Indexing (``x[...]``), symbolic shapes (``K.shape(x)[i]`` in reshape,
zeros, tile, slice) and odd inputs (empty and size-1 dims, non-contiguous
arrays) for the shape-manipulation family, inside K.function with a None
batch size."""
import numpy as np
import pytest

import cyback as K

from gradcheck import check_grads

A = np.arange(60.0).reshape(3, 4, 5) / 7.0
IDX = np.array([0, 2])
MASK = np.array([True, False, True])

# name: (index built from x and the symbolic (i, idx, mask), NumPy reference, static shape
# for x of shape (None, 4, 5))
CASES = {
    "int": (lambda x, i, idx, m: x[0], A[0], (4, 5)),
    "negative int": (lambda x, i, idx, m: x[-1], A[-1], (4, 5)),
    "reversed slice": (lambda x, i, idx, m: x[:, ::-1], A[:, ::-1], (None, 4, 5)),
    "step and int": (lambda x, i, idx, m: x[::2, 1], A[::2, 1], (None, 5)),
    "middle slice": (lambda x, i, idx, m: x[:, 1:3], A[:, 1:3], (None, 2, 5)),
    "negative slice": (lambda x, i, idx, m: x[:, :, -2:], A[:, :, -2:], (None, 4, 2)),
    "ellipsis newaxis": (lambda x, i, idx, m: x[..., None], A[..., None], (None, 4, 5, 1)),
    "newaxis int ellipsis": (lambda x, i, idx, m: x[None, 0, ..., 1], A[None, 0, ..., 1],
                             (1, 4)),
    "symbolic int": (lambda x, i, idx, m: x[:, i], A[:, 2], (None, 5)),
    "shape arithmetic": (lambda x, i, idx, m: x[K.shape(x)[0] - 1], A[2], (4, 5)),
    "symbolic bounds": (lambda x, i, idx, m: x[1:K.shape(x)[0], i - 1:i + 1],
                        A[1:3, 1:3], (None, None, 5)),
    "index tensor": (lambda x, i, idx, m: x[idx], A[IDX], (None, 4, 5)),
    "index tensor axis 1": (lambda x, i, idx, m: x[:, idx], A[:, IDX], (None, None, 5)),
    "index list": (lambda x, i, idx, m: x[:, [1, 3, 1]], A[:, [1, 3, 1]], (None, 3, 5)),
    "separated advanced": (lambda x, i, idx, m: x[1, :, idx], A[1, :, IDX], (None, 4)),
    "two index tensors": (lambda x, i, idx, m: x[idx, idx], A[IDX, IDX], (None, 5)),
    "mask": (lambda x, i, idx, m: x[m], A[MASK], (None, 4, 5)),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_getitem_in_function(name, dtype):
    build, ref, static = CASES[name]
    x = K.placeholder((None, 4, 5), dtype=dtype)
    i = K.placeholder((), dtype="int32")
    idx = K.placeholder((None,), dtype="int32")
    m = K.placeholder((None,), dtype="bool")
    out = build(x, i, idx, m)
    assert K.int_shape(out) == static
    feeds = [A.astype(dtype), 2, IDX, MASK]
    got = K.function([x, i, idx, m], [out])(feeds)[0]
    np.testing.assert_array_equal(got, ref.astype(dtype))
    assert got.dtype == dtype
    # Gradient: ones scattered (and summed, for repeated indices) into x.
    g, = K.gradients(K.sum(out), [x])
    assert K.int_shape(g) == (None, 4, 5)
    expect = np.zeros_like(A)
    index = {"int": (0,), "negative int": (-1,), "step and int": (slice(None, None, 2), 1),
             "middle slice": (slice(None), slice(1, 3)), "symbolic int": (slice(None), 2),
             "negative slice": (Ellipsis, slice(-2, None)), "shape arithmetic": (2,),
             "symbolic bounds": (slice(1, 3), slice(1, 3)), "index tensor": (IDX,),
             "index tensor axis 1": (slice(None), IDX), "separated advanced": (1, slice(None),
                                                                                IDX),
             "two index tensors": (IDX, IDX), "mask": (MASK,),
             "index list": (slice(None), [1, 3, 1]), "newaxis int ellipsis": (0, Ellipsis, 1)
             }.get(name, (Ellipsis,))
    np.add.at(expect, index, 1.0)
    np.testing.assert_array_equal(K.function([x, i, idx, m], [g])(feeds)[0], expect)


def test_getitem_numeric_gradients():
    a = A[:2, :3, :4]
    idx = K.constant([1, 0, 1], dtype="int32")
    check_grads(lambda x: x[:, 1:3, ::-2], a)
    check_grads(lambda x: x[idx, 2], a)
    check_grads(lambda x: x[..., None, 1] * x[:, :1, 1:2], a)


def test_getitem_errors():
    x = K.placeholder((None, 4))
    with pytest.raises(IndexError, match="out of bounds"):
        x[:, 4]
    with pytest.raises(IndexError, match="too many"):
        x[0, 0, 0]
    with pytest.raises(IndexError, match="integers"):
        x[K.constant([0.5])]
    with pytest.raises(ValueError, match="step"):
        x[::0]
    with pytest.raises(IndexError, match="boolean index"):
        x[:, np.array([True, False])]


def test_shape_indexing():
    x = K.placeholder((None, 4, 5))
    s = K.shape(x)
    assert K.int_shape(s) == (3,) and K.dtype(s) == "int32"
    f = K.function([x], [s, s[0], s[1:], s[-1], K.prod(s[1:])])
    got = f([np.zeros((2, 4, 5))])
    assert got[0].tolist() == [2, 4, 5]
    assert int(got[1]) == 2 and got[2].tolist() == [4, 5] and int(got[3]) == 5
    assert int(got[4]) == 20
    # Known sizes are known when building.
    assert K.eval(K.shape(K.placeholder((2, 3)))).tolist() == [2, 3]
    # Iterating a shape slice (Keras's TimeDistributed) keeps the static sizes.
    y = K.reshape(x, (-1,) + tuple(s[1:]))
    assert K.int_shape(y) == (None, 4, 5)
    i = K.placeholder((), dtype="int32")
    assert int(K.function([x, i], [s[i]])([np.zeros((2, 4, 5)), 2])[0]) == 5


@pytest.mark.parametrize("fill", ["zeros", "ones"])
def test_filled_with_symbolic_shape(fill):
    x = K.placeholder((None, 4), dtype="float64")
    make = getattr(K, fill)
    z = make((K.shape(x)[0], 3))
    assert K.int_shape(z) == (None, 3) and K.dtype(z) == K.floatx()
    z64 = make((K.shape(x)[0], K.shape(x)[1] * 2), dtype="float64")
    assert K.int_shape(z64) == (None, 8)
    out = K.concatenate([x, z64], axis=1)
    val = K.function([x], [z, out])([np.ones((2, 4))])
    assert val[0].shape == (2, 3) and np.all(val[0] == (fill == "ones"))
    assert val[1].shape == (2, 12)
    g, = K.gradients(K.sum(out * out), [x])
    np.testing.assert_array_equal(K.function([x], [g])([np.ones((2, 4))])[0], 2 * np.ones((2, 4)))
    with pytest.raises(ValueError, match=fill + ".*None"):
        make((None, 3))


def test_keras_style_pipeline_with_none_batch():
    """What Keras layers do: reshape by K.shape, tile a learned row per sample,
    concatenate, slice out, and differentiate."""
    x = K.placeholder((None, 3, 2), dtype="float64")
    w = K.variable(np.array([[1.0, -2.0]]), dtype="float64")
    flat = K.reshape(x, (K.shape(x)[0], -1))
    assert K.int_shape(flat) == (None, 6)
    rows = K.tile(w, [K.shape(x)[0], 1])
    assert K.int_shape(rows) == (None, 2)
    both = K.concatenate([flat, rows])
    assert K.int_shape(both) == (None, 8)
    out = K.sum(K.square(both[:, 4:7]) * K.arange(1, 4, dtype="float64"), axis=1)
    loss = K.mean(out)
    gx, gw = K.gradients(loss, [x, w])
    xs = np.random.default_rng(0).standard_normal((5, 3, 2))
    val, gxv, gwv = K.function([x], [out, gx, gw])([xs])
    ref_both = np.concatenate([xs.reshape(5, 6), np.tile([[1.0, -2.0]], (5, 1))], axis=1)
    np.testing.assert_allclose(val, (ref_both[:, 4:7] ** 2 * [1, 2, 3]).sum(1))
    ref_gx = np.zeros((5, 6))
    ref_gx[:, 4:6] = 2 * ref_both[:, 4:6] * [1, 2] / 5
    np.testing.assert_allclose(gxv, ref_gx.reshape(5, 3, 2))
    np.testing.assert_allclose(gwv, [[2 * 1.0 * 3 * 5 / 5, 0]])
    # The same function with a batch of one and of zero.
    assert K.function([x], [out])([xs[:1]])[0].shape == (1,)
    assert K.function([x], [out])([xs[:0]])[0].shape == (0,)


EMPTY_CASES = {
    "gather": lambda x: K.gather(x, K.constant([], dtype="int32")),
    "tile": lambda x: K.tile(x, [2, 1, 3]),
    "repeat_elements": lambda x: K.repeat_elements(x, 2, 0),
    "batch_flatten": K.batch_flatten,
    "flatten": K.flatten,
    "temporal_padding": K.temporal_padding,
    "reverse": lambda x: K.reverse(x, [0, 2]),
    "slice": lambda x: K.slice(x, [0, 1, 0], [-1, 1, 2]),
    "resize_nearest": lambda x: K.resize_images(K.expand_dims(x), 2, 2, "channels_last"),
    "resize_bilinear": lambda x: K.resize_images(K.expand_dims(x), 2, 3, "channels_last",
                                                 "bilinear"),
    "stack": lambda x: K.stack([x, x], axis=1),
    "permute": lambda x: K.permute_dimensions(x, (2, 0, 1)),
    "expand_squeeze": lambda x: K.squeeze(K.expand_dims(x, 1), 1),
}


@pytest.mark.parametrize("name", sorted(EMPTY_CASES))
def test_empty_batch(name):
    x = K.placeholder((None, 3, 2), dtype="float64")
    out = EMPTY_CASES[name](x)
    g, = K.gradients(K.sum(out), [x])
    f = K.function([x], [out, g])
    full = np.random.default_rng(1).standard_normal((2, 3, 2))
    val_full, g_full = f([full])
    val, gv = f([full[:0]])
    assert gv.shape == (0, 3, 2)
    # Same layout as the full batch, with the batch-derived axes empty.
    assert val.size == 0
    assert val.ndim == val_full.ndim
    assert g_full.shape == full.shape


def test_size_one_dims(rng):
    a = rng.standard_normal((1, 1, 3))
    check_grads(lambda x: K.resize_images(K.expand_dims(x), 3, 2, "channels_last",
                                          "bilinear"), a)
    check_grads(lambda x: K.tile(x, [2, 3, 1]), a)
    check_grads(lambda x: K.squeeze(K.squeeze(x, 0), 0), a)
    check_grads(lambda x: K.gather(x, K.constant([0, 0, 0], dtype="int32")), a)


NONCONTIG = {
    "permute": lambda x: K.permute_dimensions(x, (1, 0, 2)),
    "gather": lambda x: K.gather(x, K.constant([3, 1], dtype="int32")),
    "tile": lambda x: K.tile(x, [1, 2, 1]),
    "pad": lambda x: K.temporal_padding(x, (1, 2)),
    "bilinear": lambda x: K.resize_images(K.expand_dims(x), 2, 2, "channels_last",
                                          "bilinear"),
    "batch_flatten": K.batch_flatten,
    "reshape": lambda x: K.reshape(x, (K.shape(x)[0], -1)),
    "slice": lambda x: K.slice(x, [1, 0, 1], [2, -1, 1]),
    "one_hot_gather": lambda x: K.one_hot(K.cast(K.gather(x, K.constant([0], "int32")) > 0,
                                                  "int32"), 2),
}


@pytest.mark.parametrize("name", sorted(NONCONTIG))
def test_non_contiguous_input(rng, name):
    base = rng.standard_normal((3, 4, 6))
    strided = base.transpose(1, 0, 2)[:, :, ::2]  # (4, 3, 3), not contiguous
    assert not strided.flags.c_contiguous
    x = K.placeholder((None, 3, 3), dtype="float64")
    out = NONCONTIG[name](x)
    outs = [out]
    if name != "one_hot_gather":
        outs += K.gradients(K.sum(K.square(out)), [x])
    f = K.function([x], outs)
    for a, b in zip(f([strided]), f([np.ascontiguousarray(strided)])):
        np.testing.assert_array_equal(a, b)
    if name != "one_hot_gather":
        check_grads(NONCONTIG[name], strided)
    assert np.all(strided == base.transpose(1, 0, 2)[:, :, ::2])  # inputs untouched


def test_shape_arguments_must_be_integers():
    x = K.placeholder((None, 8))
    with pytest.raises(TypeError, match="reshape: shape entries must be integers.*float32"):
        K.reshape(x, (K.shape(x)[0], K.cast(K.shape(x)[1], "float32")))
    with pytest.raises(TypeError, match="tile: shape entries must be integers"):
        K.tile(x, [1, 2.5])
    with pytest.raises(ValueError, match="zeros.*None"):
        K.zeros((None, 2))
    # Whole floats too (TensorFlow refuses them: a float size is usually a
    # division that should have been //).
    with pytest.raises(TypeError, match="reshape: shape entries must be integers, got 4.0"):
        K.reshape(x, (-1, 8 / 2))
    # Size arithmetic on float tensors is never taken for a static size.
    y = K.reshape(x, (K.shape(x)[0], K.cast(K.cast(K.shape(x)[1], "float32") * 0.5, "int32"),
                      2))
    assert K.int_shape(y) == (None, None, 2)
    assert K.function([x], [y])([np.zeros((3, 8))])[0].shape == (3, 4, 2)
