"""kernels/conv_blocks.pxi (conv.block_forward): a depthwise block (1x1 expansion, depthwise, 1x1
projection) run row by row, against a NumPy reference of the three layers."""
import numpy as np
import pytest

from cyback.kernels import conv as blocks
from cyback.kernels import runtime

from instruction_sets import instruction_set

ACTS = {None: lambda v: v, "relu": lambda v: np.maximum(v, 0),
        "relu6": lambda v: np.minimum(np.maximum(v, 0), 6)}


def reference(x, expand, depthwise, project, residual, strides, pads):
    h = x.astype(np.float64)
    if expand is not None:
        k, b, act = expand
        h = ACTS[act](h @ k + (0 if b is None else b))
    k, b, act = depthwise
    kh, kw, _ = k.shape
    (pt, pb), (pl, pr) = pads
    hp = np.pad(h, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    sh, sw = strides
    oh = (hp.shape[1] - kh) // sh + 1
    ow = (hp.shape[2] - kw) // sw + 1
    out = np.zeros((h.shape[0], oh, ow, h.shape[3]))
    for i in range(kh):
        for j in range(kw):
            out += hp[:, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw, :] * k[i, j]
    out = ACTS[act](out + (0 if b is None else b))
    if project is not None:
        k, b, act = project
        out = out @ k + (0 if b is None else b)
        if residual is not None:
            out = out + residual
        out = ACTS[act](out)
    return out


def stage(rng, shape, dtype, act, bias=True):
    k = (rng.standard_normal(shape) * 0.4).astype(dtype)
    b = rng.standard_normal(shape[-1]).astype(dtype) if bias else None
    return k, b, act


CASES = [
    # N, H, W, C, E (None: no expansion), F (None: no projection), KH, KW, strides, pads,
    # residual
    (1, 12, 17, 5, 13, 7, 3, 3, (1, 1), ((1, 1), (1, 1)), False),
    (2, 12, 12, 6, 20, 6, 3, 3, (1, 1), ((1, 1), (1, 1)), True),
    (1, 13, 11, 4, 9, 3, 3, 3, (2, 2), ((0, 1), (0, 1)), False),
    (3, 10, 11, 8, None, 16, 5, 5, (2, 1), ((2, 2), (2, 2)), False),
    (2, 9, 9, 3, 8, None, 3, 3, (1, 1), ((0, 0), (0, 0)), False),
    (1, 1, 1, 1, 1, 1, 1, 1, (1, 1), ((0, 0), (0, 0)), True),
    (1, 1, 9, 3, 4, 2, 3, 3, (1, 1), ((1, 1), (1, 1)), False),
    (2, 7, 5, 2, 3, 5, 1, 3, (3, 2), ((0, 0), (1, 1)), False),
    (1, 6, 6, 16, 40, 16, 7, 7, (1, 1), ((3, 3), (3, 3)), True),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES)
def test_block_matches_the_three_layers(case, dtype):
    n, h, w, c, e, f, kh, kw, strides, pads, res = case
    rng = np.random.default_rng(h * 31 + w)
    x = rng.standard_normal((n, h, w, c)).astype(dtype)
    mid = c if e is None else e
    expand = None if e is None else stage(rng, (c, e), dtype, "relu6")
    depthwise = stage(rng, (kh, kw, mid), dtype, "relu")
    project = None if f is None else stage(rng, (mid, f), dtype, None)
    want_shape = reference(x, expand, depthwise, project, None, strides, pads).shape
    residual = rng.standard_normal(want_shape).astype(dtype) if res else None
    want = reference(x, expand, depthwise, project, residual, strides, pads)
    got = blocks.block_forward(x, expand, depthwise, project, residual, strides, pads)
    assert got.dtype == dtype and got.shape == want.shape
    tol = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("acts", [(None, None, None), ("relu", "relu6", "relu"),
                                  ("relu6", None, "relu6")])
def test_activations_and_missing_biases(acts):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((1, 8, 10, 4)) * 3).astype(np.float32)
    expand = stage(rng, (4, 12), np.float32, acts[0], bias=False)
    depthwise = stage(rng, (3, 3, 12), np.float32, acts[1], bias=False)
    project = stage(rng, (12, 5), np.float32, acts[2], bias=True)
    pads = ((1, 1), (1, 1))
    got = blocks.block_forward(x, expand, depthwise, project, None, (1, 1), pads)
    want = reference(x, expand, depthwise, project, None, (1, 1), pads)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-4)


def test_bands_and_threads_give_the_same_bits():
    # a band repeats the expansion of the rows its neighbour reads: to the bit
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 23, 19, 6)).astype(np.float32)
    expand = stage(rng, (6, 24), np.float32, "relu6")
    depthwise = stage(rng, (3, 3, 24), np.float32, "relu6")
    project = stage(rng, (24, 8), np.float32, None)
    args = (x, expand, depthwise, project, None, (2, 2), ((1, 1), (1, 1)))
    first = blocks.block_forward(*args)
    for bands in (1, 2, 3, 5, 12, 100):
        assert np.array_equal(blocks.block_forward(*args, bands=bands), first)
    before = runtime.get_max_threads()
    try:
        for threads in (1, 2, 3):
            runtime.set_num_threads(threads)
            assert np.array_equal(blocks.block_forward(*args), first)
    finally:
        runtime.set_num_threads(before)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "baseline"])
def test_every_instruction_set(isa):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 9, 21, 5)).astype(np.float32)
    expand = stage(rng, (5, 40), np.float32, "relu6")
    depthwise = stage(rng, (3, 3, 40), np.float32, "relu6")
    project = stage(rng, (40, 9), np.float32, None)
    res = rng.standard_normal((2, 9, 21, 9)).astype(np.float32)
    pads = ((1, 1), (1, 1))
    want = reference(x, expand, depthwise, project, res, (1, 1), pads)
    with instruction_set(blocks, isa):
        got = blocks.block_forward(x, expand, depthwise, project, res, (1, 1), pads)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-4)


def test_strided_input_and_residual_views():
    rng = np.random.default_rng(8)
    big = rng.standard_normal((2, 10, 16, 12)).astype(np.float64)
    x = big[:, :, ::2, 1:7]           # not contiguous
    expand = stage(rng, (6, 10), np.float64, "relu")
    depthwise = stage(rng, (3, 3, 10), np.float64, "relu")
    project = stage(rng, (10, 6), np.float64, None)
    res = rng.standard_normal((2, 10, 8, 12))[..., :6]
    pads = ((1, 1), (1, 1))
    got = blocks.block_forward(x, expand, depthwise, project, res, (1, 1), pads)
    want = reference(x, expand, depthwise, project, res, (1, 1), pads)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_empty_batch():
    rng = np.random.default_rng(9)
    x = np.zeros((0, 6, 6, 3), np.float32)
    got = blocks.block_forward(x, stage(rng, (3, 8), np.float32, "relu"),
                               stage(rng, (3, 3, 8), np.float32, None),
                               stage(rng, (8, 4), np.float32, None), None, (2, 2),
                               ((1, 1), (1, 1)))
    assert got.shape == (0, 3, 3, 4)


def test_nan_in_one_pixel_stays_in_its_window():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((1, 9, 9, 2)).astype(np.float32)
    x[0, 4, 4, 0] = np.nan
    got = blocks.block_forward(x, stage(rng, (2, 4), np.float32, None),
                               stage(rng, (3, 3, 4), np.float32, None),
                               stage(rng, (4, 3), np.float32, None), None, (1, 1),
                               ((1, 1), (1, 1)))
    bad = np.isnan(got).any(axis=-1)[0]
    want = np.zeros((9, 9), bool)
    want[3:6, 3:6] = True
    assert np.array_equal(bad, want)


def _args(**change):
    rng = np.random.default_rng(0)
    args = dict(x=np.zeros((1, 6, 6, 3), np.float32),
                expand=stage(rng, (3, 8), np.float32, "relu"),
                depthwise=stage(rng, (3, 3, 8), np.float32, "relu"),
                project=stage(rng, (8, 4), np.float32, None), residual=None,
                strides=(1, 1), pads=((1, 1), (1, 1)))
    args.update(change)
    return args


F32 = np.float32


@pytest.mark.parametrize("change,error,match", [
    (dict(x=np.zeros((1, 6, 6, 3), np.int32)), TypeError, "float32 or float64"),
    (dict(x=np.zeros((6, 6, 3), F32)), ValueError, r"\(N, H, W, C\)"),
    (dict(depthwise=None), ValueError, "needs its depthwise"),
    (dict(project=None, residual=np.zeros((1, 6, 6, 8), F32)), ValueError,
     "residual needs the projection"),
    (dict(expand=(np.zeros((4, 8), F32), None, None)), ValueError, r"\(3, channels out\)"),
    (dict(expand=(np.zeros((3, 8), np.float64), None, None)), TypeError, "float32 array"),
    (dict(depthwise=(np.zeros((3, 3, 7), F32), None, None)), ValueError, r"\(KH, KW, 8\)"),
    (dict(project=(np.zeros((8, 4), F32), np.zeros(3, F32), None)), ValueError,
     r"project bias must be a \(4,\)"),
    (dict(project=(np.zeros((8, 4), F32), None, "gelu")), ValueError, "activation"),
    (dict(project=[np.zeros((8, 4), F32), None, None]), TypeError, "kernel, bias, activation"),
    (dict(expand=(np.zeros((3, 2000), F32), None, None)), ValueError, "2000 channels"),
    (dict(depthwise=(np.zeros((17, 1, 8), F32), None, None)), ValueError, "1 to 16 rows"),
    (dict(residual=np.zeros((1, 6, 5, 4), F32)), ValueError, r"shape \(1, 6, 6, 4\)"),
    (dict(strides=(0, 1)), ValueError, "strides must be positive"),
    (dict(pads=((1, -1), (1, 1))), ValueError, "non-negative"),
    (dict(pads=(1, 1)), ValueError, r"\(\(top, bottom\), \(left, right\)\)"),
    (dict(pads=((0, 0), (0, 0)), depthwise=(np.zeros((7, 7, 8), F32), None, None)),
     ValueError, "smaller than"),
])
def test_bad_arguments(change, error, match):
    with pytest.raises(error, match=match):
        blocks.block_forward(**_args(**change))
