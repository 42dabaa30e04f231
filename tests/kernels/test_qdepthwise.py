"""qgemm.depthwise_conv, the int8 depthwise convolution: against an exact
integer reference on random shapes (odd channel counts, strides, dilation,
padding) with every instruction set the CPU runs, the requantized uint8
output, the edges of the codes, and the argument checks."""
import numpy as np
import pytest

import cyback as K
from cyback.kernels import qgemm

ACTS = {None: lambda y: y, 'relu': lambda y: np.maximum(np.float32(0), y),
        'relu6': lambda y: np.minimum(np.float32(6), np.maximum(np.float32(0), y))}


def _paths():
    """Every set the CPU runs; on avx512_vnni with AVX-512 VBMI, both the
    byte-tap path and the widening one."""
    out = [(name, True) for name in qgemm.instruction_sets()]
    if "avx512_vnni" in qgemm.instruction_sets():
        qgemm._use_instruction_set("avx512_vnni")
        try:
            if qgemm._depthwise_byte_taps():
                out.append(("avx512_vnni", False))
        finally:
            qgemm._use_instruction_set(None)
    return out


PATHS = _paths()


@pytest.fixture(params=PATHS, ids=["%s%s" % (s, "" if b else "-widening") for s, b in PATHS])
def instruction_set(request):
    name, byte_taps = request.param
    assert qgemm._use_instruction_set(name) == name
    qgemm._depthwise_byte_taps(byte_taps)
    yield name
    qgemm._depthwise_byte_taps(True)
    qgemm._use_instruction_set(None)


def reference_sums(x, w, strides, dilation, pads, zero):
    """int64 (N, OH, OW, C): sum over the window of (x - zero) * w, padding
    at 0 (the zero point's code)."""
    q = x.astype(np.int64) - zero
    q = np.pad(q, [(0, 0), pads[0], pads[1], (0, 0)])
    kh, kw = w.shape[:2]
    (sh, sw), (dh, dw) = strides, dilation
    oh = (q.shape[1] - (kh - 1) * dh - 1) // sh + 1
    ow = (q.shape[2] - (kw - 1) * dw - 1) // sw + 1
    acc = np.zeros((x.shape[0], oh, ow, x.shape[3]), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            acc += q[:, ky * dh:ky * dh + (oh - 1) * sh + 1:sh,
                     kx * dw:kx * dw + (ow - 1) * sw + 1:sw] * w[ky, kx].astype(np.int64)
    return acc


def reference(x, w, scale_a, zero, scale_w, bias, act, strides, dilation, pads):
    acc = reference_sums(x, w, strides, dilation, pads, zero)
    y = acc.astype(np.int32).astype(np.float32) * (np.float32(scale_a) * scale_w)
    if bias is not None:
        y = y + bias
    return ACTS[act](y)


CASES = [
    # N, H, W, C, (kh, kw), strides, dilation, pads
    (1, 7, 9, 16, (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1))),
    (2, 8, 8, 5, (3, 3), (2, 2), (1, 1), ((0, 1), (0, 1))),
    (1, 11, 6, 37, (5, 3), (1, 2), (2, 1), ((4, 4), (1, 1))),
    (3, 4, 5, 33, (1, 1), (1, 1), (1, 1), ((0, 0), (0, 0))),
    (1, 6, 6, 64, (3, 3), (1, 1), (1, 1), ((0, 0), (0, 0))),
    (2, 5, 7, 1, (2, 4), (1, 3), (1, 1), ((1, 0), (2, 1))),
    # runs of pixels inside the image with blocks of 32 and 16 channels and a tail
    (2, 9, 23, 53, (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1))),
    (1, 10, 21, 48, (3, 3), (2, 2), (1, 1), ((0, 1), (0, 1))),
    (1, 12, 14, 32, (3, 3), (1, 1), (2, 3), ((2, 2), (3, 3))),
    (1, 4, 9, 20, (3, 5), (1, 1), (1, 1), ((0, 0), (0, 0))),
    # the byte-tap path: windows up to four taps wide, stride 1 along the row,
    # any height, vertical stride and dilation
    (1, 11, 6, 37, (5, 3), (2, 1), (2, 1), ((4, 4), (1, 1))),
    (2, 5, 9, 17, (2, 4), (1, 1), (1, 1), ((1, 0), (2, 1))),
    (3, 6, 7, 3, (1, 2), (1, 1), (1, 1), ((0, 0), (0, 1))),
    (1, 3, 2, 70, (3, 3), (1, 1), (1, 1), ((2, 2), (2, 2))),   # more pad than image
]


@pytest.mark.parametrize('case', CASES)
@pytest.mark.parametrize('act', [None, 'relu', 'relu6'])
def test_against_the_integer_reference(instruction_set, case, act):
    n, h, w_, c, ks, st, dil, pads = case
    rs = np.random.RandomState(c * 7 + h)
    x = rs.randint(0, 256, size=(n, h, w_, c)).astype(np.uint8)
    w = rs.randint(-127, 128, size=ks + (c,)).astype(np.int8)
    scale_w = rs.uniform(0.001, 0.01, size=c).astype(np.float32)
    bias = rs.randn(c).astype(np.float32)
    zero = int(rs.randint(0, 256))
    vectors = qgemm.epilogue_vectors(0.05, scale_w, bias)
    got = qgemm.depthwise_conv(x, qgemm.pack_depthwise(w), vectors, zero, ks, st, dil, pads,
                               activation=act)
    want = reference(x, w, 0.05, zero, scale_w, bias, act, st, dil, pads)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


def test_extreme_codes_are_exact(instruction_set):
    # every activation 255 or 0 and weights at -127 / 127: the largest sums
    x = np.full((1, 9, 9, 19), 255, np.uint8)
    x[0, ::2] = 0
    w = np.where(np.arange(19) % 2, 127, -127).astype(np.int8) * np.ones((7, 7, 1), np.int8)
    scale_w = np.ones(19, np.float32)
    vectors = qgemm.epilogue_vectors(1.0, scale_w)
    got = qgemm.depthwise_conv(x, qgemm.pack_depthwise(w), vectors, 0, (7, 7),
                               pads=((3, 3), (3, 3)))
    want = reference_sums(x, w, (1, 1), (1, 1), ((3, 3), (3, 3)), 0)
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_weights_of_minus_128_are_exact(instruction_set):
    # -128 is an int8 weight too (the packed weights are its sign extension)
    x = np.full((1, 6, 40, 37), 255, np.uint8)
    x[0, :, ::3] = 0
    w = np.full((3, 3, 37), -128, np.int8)
    w[1, 1, ::2] = 127
    vectors = qgemm.epilogue_vectors(1.0, np.ones(37, np.float32))
    got = qgemm.depthwise_conv(x, qgemm.pack_depthwise(w), vectors, 3, (3, 3),
                               pads=((1, 1), (1, 1)))
    want = reference_sums(x, w, (1, 1), (1, 1), ((1, 1), (1, 1)), 3)
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_uint8_output_and_same_bits_on_every_set():
    rs = np.random.RandomState(3)
    x = rs.randint(0, 256, size=(2, 10, 10, 21)).astype(np.uint8)
    w = rs.randint(-127, 128, size=(3, 3, 21)).astype(np.int8)
    vectors = qgemm.epilogue_vectors(0.02, rs.uniform(0.001, 0.01, 21), rs.randn(21))
    packed = qgemm.pack_depthwise(w)
    outs = []
    for name in qgemm.instruction_sets():
        qgemm._use_instruction_set(name)
        try:
            f = qgemm.depthwise_conv(x, packed, vectors, 7, (3, 3), pads=((1, 1), (1, 1)),
                                     activation='relu6')
            q = qgemm.depthwise_conv(x, packed, vectors, 7, (3, 3), pads=((1, 1), (1, 1)),
                                     activation='relu6', out_scale=6 / 255, out_zero_point=0)
        finally:
            qgemm._use_instruction_set(None)
        v = np.clip(f / np.float32(6 / 255), 0, 255)
        np.testing.assert_array_equal(q, np.rint(v).astype(np.uint8))
        outs.append((f.tobytes(), q.tobytes()))
    assert len(set(outs)) == 1


def test_pack_layout():
    w = np.arange(-6, 6, dtype=np.int8).reshape(2, 2, 3)
    p = qgemm.pack_depthwise(w)
    assert p.dtype == np.int32 and p.shape == (7, 16)
    np.testing.assert_array_equal(p[:4, :3], w.reshape(4, 3))
    np.testing.assert_array_equal(p[4, :3], w.reshape(4, 3).sum(axis=0))
    # window row ky's taps as the bytes of one little-endian int32, zero past kw
    rows = p[5:].copy().view(np.int8).reshape(2, 16, 4)
    np.testing.assert_array_equal(rows[:, :3, :2], w.transpose(0, 2, 1))
    assert not rows[:, :3, 2:].any()
    assert not p[:, 3:].any()


def test_pack_layout_of_wide_windows():
    # the byte rows hold a window row's first four taps; wider windows take
    # the widening path, which never reads them
    w = np.arange(2 * 6 * 2, dtype=np.int8).reshape(2, 6, 2)
    p = qgemm.pack_depthwise(w)
    assert p.shape == (2 * 6 + 1 + 2, 16)
    rows = p[13:].copy().view(np.int8).reshape(2, 16, 4)
    np.testing.assert_array_equal(rows[:, :2, :], w[:, :4].transpose(0, 2, 1))


def test_argument_checks():
    x = np.zeros((1, 4, 4, 3), np.uint8)
    w = np.zeros((3, 3, 3), np.int8)
    vec = qgemm.epilogue_vectors(1.0, np.ones(3))
    with pytest.raises(TypeError, match='pack_depthwise'):
        qgemm.pack_depthwise(w.astype(np.int16))
    with pytest.raises(TypeError, match='depthwise_conv'):
        qgemm.depthwise_conv(x.astype(np.float32), qgemm.pack_depthwise(w), vec, 0, 3)
    with pytest.raises(ValueError, match='pack_depthwise'):
        qgemm.depthwise_conv(x, qgemm.pack_depthwise(w[:2]), vec, 0, 3)
    with pytest.raises(ValueError, match='does not fit'):
        qgemm.depthwise_conv(x, qgemm.pack_depthwise(np.zeros((5, 5, 3), np.int8)), vec, 0, 5)
    with pytest.raises(ValueError, match='epilogue vectors'):
        qgemm.depthwise_conv(x, qgemm.pack_depthwise(w), qgemm.epilogue_vectors(1.0, [1.0] * 17),
                             0, 3)


@pytest.mark.parametrize("n,h,w_,c", [(3, 9, 10, 48), (1, 14, 14, 35), (2, 5, 3, 1)])
def test_byte_taps_give_the_widening_paths_bits(n, h, w_, c):
    # every thread count (a thread's cached input rows span its lines, and
    # images), float and uint8 outputs, against the widening path
    if "avx512_vnni" not in qgemm.instruction_sets():
        pytest.skip("no AVX-512 VNNI")
    rs = np.random.RandomState(h * c)
    x = rs.randint(0, 256, size=(n, h, w_, c)).astype(np.uint8)
    w = rs.randint(-128, 128, size=(3, 3, c)).astype(np.int8)
    vectors = qgemm.epilogue_vectors(0.03, rs.uniform(0.001, 0.01, c), rs.randn(c))
    packed = qgemm.pack_depthwise(w)
    saved = K.get_num_threads()
    outs = []
    try:
        for byte_taps in (True, False):
            if qgemm._depthwise_byte_taps(byte_taps) != byte_taps:
                pytest.skip("no AVX-512 VBMI")
            for threads in (1, 2, 3):
                K.set_num_threads(threads)
                f = qgemm.depthwise_conv(x, packed, vectors, 5, (3, 3),
                                         pads=((1, 1), (1, 1)), activation='relu')
                q = qgemm.depthwise_conv(x, packed, vectors, 5, (3, 3), strides=(2, 1),
                                         pads=((1, 1), (1, 1)), activation='relu6',
                                         out_scale=6 / 255, out_zero_point=0)
                outs.append((f.tobytes(), q.tobytes()))
    finally:
        qgemm._depthwise_byte_taps(True)
        K.set_num_threads(saved)
    assert len(set(outs)) == 1


def test_depthwise_call_gives_depthwise_convs_bits():
    rs = np.random.RandomState(5)
    w = rs.randint(-128, 128, size=(3, 3, 21)).astype(np.int8)
    packed = qgemm.pack_depthwise(w)
    vectors = qgemm.epilogue_vectors(0.02, rs.uniform(0.001, 0.01, 21), rs.randn(21))
    for out in ((None, None), (0.03, 4)):
        call = qgemm.DepthwiseCall(packed, vectors, 21, 6, (3, 3), (2, 1), (1, 1),
                                   ((1, 1), (0, 2)), 'relu6', *out)
        # one call over inputs of several shapes, and an empty batch
        for shape in ((2, 9, 7, 21), (1, 4, 12, 21), (0, 5, 5, 21)):
            x = rs.randint(0, 256, size=shape).astype(np.uint8)
            want = qgemm.depthwise_conv(x, packed, vectors, 6, (3, 3), (2, 1), (1, 1),
                                        ((1, 1), (0, 2)), 'relu6', *out)
            got = call(x)
            assert got.dtype == want.dtype and got.shape == want.shape
            assert got.tobytes() == want.tobytes()
        # a strided view is read as its values
        x = rs.randint(0, 256, size=(1, 8, 16, 21)).astype(np.uint8)
        assert call(x[:, :, ::2]).tobytes() == call(np.ascontiguousarray(x[:, :, ::2])).tobytes()


def test_depthwise_call_knows_its_arrays_and_checks_its_input():
    import gc
    import weakref
    w = np.ones((3, 3, 5), np.int8)
    packed = qgemm.pack_depthwise(w)
    vectors = qgemm.epilogue_vectors(1.0, np.ones(5))
    call = qgemm.DepthwiseCall(packed, vectors, 5, 0, 3, pads=((1, 1), (1, 1)))
    assert call.matches(packed, vectors) and not call.matches(packed.copy(), vectors)
    with pytest.raises(TypeError, match="4-D uint8"):
        call(np.zeros((1, 4, 4, 5), np.float32))
    with pytest.raises(ValueError, match="expected 5 channels"):
        call(np.zeros((1, 4, 4, 6), np.uint8))
    with pytest.raises(ValueError, match="does not fit"):
        qgemm.DepthwiseCall(packed, vectors, 5, 0, 3)(np.zeros((1, 1, 4, 5), np.uint8))
    with pytest.raises(ValueError, match="pack_depthwise"):
        qgemm.DepthwiseCall(packed, vectors, 17, 0, 3)
    with pytest.raises(ValueError, match="pads must be >= 0"):
        qgemm.DepthwiseCall(packed, vectors, 5, 0, 3, pads=((-1, 0), (0, 0)))
    alive = weakref.ref(packed)
    del packed
    gc.collect()
    assert alive() is None and not call.matches(qgemm.pack_depthwise(w), vectors)
