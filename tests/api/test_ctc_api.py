"""ctc_batch_cost, ctc_decode and ctc_label_dense_to_sparse through the
backend API: brute-force enumeration of alignments on tiny cases, gradients
against finite differences, impossible labels, decoding outputs."""
import itertools

import numpy as np
import pytest

import cyback as K

import gradcheck


def collapse(path, blank):
    out, prev = [], None
    for k in path:
        if k != prev and k != blank:
            out.append(k)
        prev = k
    return tuple(out)


def keras_probs(y, eps):
    """What the CTC code sees: softmax(log(y + eps)) per frame."""
    p = np.asarray(y, np.float64) + eps
    return p / p.sum(-1, keepdims=True)


def labelling_probs(p):
    """{labelling: probability} summed over every alignment of (T, K) probs."""
    T, nk = p.shape
    out = {}
    for path in itertools.product(range(nk), repeat=T):
        lab = collapse(path, nk - 1)
        out[lab] = out.get(lab, 0.0) + np.prod([p[t, k] for t, k in enumerate(path)])
    return out


def brute_loss(y, labels, in_len, lab_len, eps):
    res = []
    for b in range(y.shape[0]):
        p = keras_probs(y[b, :in_len[b]], eps)
        target = tuple(int(v) for v in labels[b, :lab_len[b]])
        prob = labelling_probs(p).get(target, 0.0) if in_len[b] else float(target == ())
        res.append(-np.log(prob) if prob > 0 else np.inf)
    return np.array(res)


def softmax_rows(rs, shape, dtype="float64"):
    z = rs.randn(*shape)
    e = np.exp(z - z.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(dtype)


def _cost_fn(dtype="float32"):
    y_true = K.placeholder((None, None), dtype="int32")
    y_pred = K.placeholder((None, None, None), dtype=dtype)
    il = K.placeholder((None, 1), dtype="int32")
    ll = K.placeholder((None, 1), dtype="int32")
    cost = K.ctc_batch_cost(y_true, y_pred, il, ll)
    return K.function([y_true, y_pred, il, ll], [cost]), cost, y_pred, [y_true, y_pred, il, ll]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_batch_cost_matches_enumeration(dtype):
    rs = np.random.RandomState(0)
    y = softmax_rows(rs, (4, 5, 3), dtype)          # 2 labels + blank (index 2)
    labels = np.array([[0, 1, 0], [1, 1, 0], [0, 0, 0], [1, 0, 1]], "int32")
    lab_len = np.array([[2], [2], [0], [3]], "int32")
    in_len = np.array([[5], [4], [3], [5]], "int32")
    f, cost, _, _ = _cost_fn(dtype)
    got = f([labels, y, in_len, lab_len])[0]
    assert got.shape == (4, 1) and got.dtype == dtype
    assert K.int_shape(cost) == (None, 1)
    ref = brute_loss(y, labels, in_len[:, 0], lab_len[:, 0], K.epsilon())
    np.testing.assert_allclose(got[:, 0], ref, rtol=1e-5 if dtype == "float32" else 1e-10)


def test_batch_cost_lengths_as_vectors_and_float_labels():
    rs = np.random.RandomState(1)
    y = softmax_rows(rs, (2, 4, 4), "float32")
    labels = np.array([[0, 2], [1, 0]], "float32")
    cost = K.ctc_batch_cost(K.constant(labels), K.constant(y), K.constant([4, 3], "int32"),
                            K.constant([2, 1], "int32"))
    ref = brute_loss(y, labels.astype(int), [4, 3], [2, 1], K.epsilon())
    np.testing.assert_allclose(K.eval(cost)[:, 0], ref, rtol=1e-5)


def test_batch_cost_gradient():
    rs = np.random.RandomState(2)
    y = softmax_rows(rs, (2, 4, 3))
    labels = K.constant(np.array([[0, 1], [1, 1]]), "int32")
    il = K.constant(np.array([[4], [4]]), "int32")
    ll = K.constant(np.array([[2], [2]]), "int32")
    gradcheck.check_grads(lambda yp: K.ctc_batch_cost(labels, yp, il, ll), y,
                          rtol=1e-5, atol=1e-7)


def test_batch_cost_gradient_masks_frames_past_input_length():
    rs = np.random.RandomState(3)
    y = softmax_rows(rs, (2, 5, 3), "float32")
    f, cost, yp, phs = _cost_fn()
    g = K.function(phs, K.gradients(K.sum(cost), [yp]))
    grad = g([np.array([[0], [1]], "int32"), y, np.array([[5], [3]], "int32"),
              np.array([[1], [1]], "int32")])[0]
    assert np.all(grad[1, 3:] == 0) and np.any(grad[1, :3] != 0)
    assert np.all(np.isfinite(grad))


def test_impossible_alignment_inf_loss_zero_gradient():
    rs = np.random.RandomState(4)
    y = softmax_rows(rs, (2, 3, 3), "float32")
    labels = np.array([[0, 0, 1], [0, 1, 0]], "int32")
    # [0, 0] needs 3 frames (a blank between the repeats): fits 3 frames, not 2
    f, cost, yp, phs = _cost_fn()
    args = [labels, y, np.array([[2], [3]], "int32"), np.array([[2], [3]], "int32")]
    loss = f(args)[0][:, 0]
    assert np.isinf(loss[0]) and loss[0] > 0
    np.testing.assert_allclose(loss[1], brute_loss(y[1:], labels[1:], [3], [3],
                                                   K.epsilon())[0], rtol=1e-5)
    grad = K.function(phs, K.gradients(K.sum(cost), [yp]))(args)[0]
    assert not np.any(np.isnan(grad))
    assert np.all(grad[0] == 0)


def test_batch_cost_label_equal_to_blank_is_finite():
    """TF gives a finite loss for a label equal to the blank (the last class);
    Keras's OCR example labels blank images [blank]. The extended label is then
    three blank states that are never skipped, so every alignment emits the
    blank each frame and the loss is -sum log p(blank) - log(#state paths)."""
    def n_paths(T):
        # Paths over states 0..2 that start in 0 or 1, stay or move by one
        # each frame, and end in 1 or 2 (TF's recursion without the skip).
        count = np.array([1, 1, 0])
        for _ in range(T - 1):
            count = count + np.concatenate([[0], count[:-1]])
        return count[1] + count[2]
    f, _, _, _ = _cost_fn("float64")
    y = softmax_rows(np.random.RandomState(7), (2, 4, 3), "float64")
    labels = np.array([[2, 0], [2, 0]], "int32")
    loss = f([labels, y, np.array([[4], [3]], "int32"), np.array([[1], [1]], "int32")])[0]
    assert np.all(np.isfinite(loss))
    eps = K.epsilon()
    p = (y + eps) / (y + eps).sum(-1, keepdims=True)
    want = [-np.log(p[0, :4, 2]).sum() - np.log(n_paths(4)),
            -np.log(p[1, :3, 2]).sum() - np.log(n_paths(3))]
    np.testing.assert_allclose(loss[:, 0], want, rtol=1e-10)


def test_greedy_decode():
    # frames: a, a, blank, a, b, b (classes a=0, b=1, blank=2) -> [0, 0, 1]
    y = np.full((2, 6, 3), 0.05, "float32")
    for t, k in enumerate([0, 0, 2, 0, 1, 1]):
        y[0, t, k] = 0.9
    for t, k in enumerate([1, 2, 2, 2, 2, 2]):
        y[1, t, k] = 0.9
    x = K.placeholder((None, None, 3))
    il = K.placeholder((None,), dtype="int32")
    decoded, log_prob = K.ctc_decode(x, il, greedy=True)
    assert isinstance(decoded, list) and len(decoded) == 1
    f = K.function([x, il], decoded + [log_prob])
    dec, lp = f([y, np.array([6, 6], "int32")])
    np.testing.assert_array_equal(dec, [[0, 0, 1], [1, -1, -1]])
    # TensorFlow's greedy score: minus the sum of each frame's best log-probability
    ref = -np.log(y.max(-1) + K.epsilon()).sum(-1)
    np.testing.assert_allclose(lp[:, 0], ref, rtol=1e-5)
    # input_length cuts frames
    dec, _ = f([y, np.array([2, 1], "int32")])
    np.testing.assert_array_equal(dec, [[0], [1]])


def test_beam_decode_matches_enumeration():
    rs = np.random.RandomState(5)
    y = softmax_rows(rs, (3, 4, 3), "float32")
    decoded, log_prob = K.ctc_decode(K.constant(y), K.constant([4, 4, 3], "int32"),
                                     greedy=False, beam_width=50, top_paths=3)
    assert len(decoded) == 3
    dec = [K.eval(d) for d in decoded]
    lp = K.eval(log_prob)
    assert lp.shape == (3, 3)
    for b, n in enumerate([4, 4, 3]):
        probs = labelling_probs(keras_probs(y[b, :n], K.epsilon()))
        best = sorted(probs.items(), key=lambda kv: -kv[1])[:3]
        for p in range(3):
            row = dec[p][b]
            got = tuple(int(v) for v in row if v != -1)
            assert np.all(row[len(got):] == -1)
            np.testing.assert_allclose(lp[b, p], np.log(best[p][1]), rtol=1e-4)
            assert np.isclose(probs[got], best[p][1], rtol=1e-4)


def test_dense_to_sparse():
    labels = np.array([[1, 2, 0], [3, 0, 0], [4, 5, 6]], "int32")
    sp = K.ctc_label_dense_to_sparse(K.constant(labels, "int32"),
                                     K.constant([2, 1, 3], "int32"))
    assert K.is_sparse(sp)
    dense = K.eval(K.to_dense(sp))
    np.testing.assert_array_equal(dense, [[1, 2, 0], [3, 0, 0], [4, 5, 6]])
    # K.eval gives sparse values densely (as Theano); a function keeps them sparse.
    np.testing.assert_array_equal(K.eval(sp), dense)
    val = K.function([], [sp])([])[0]
    assert val.tocoo().nnz == 6


def test_bad_arguments():
    with pytest.raises(ValueError, match="ctc_batch_cost.*y_pred"):
        K.ctc_batch_cost(K.zeros((2, 3), dtype="int32"), K.zeros((2, 3)), K.zeros((2, 1)),
                         K.zeros((2, 1)))
    with pytest.raises(ValueError, match="ctc_batch_cost.*y_true"):
        K.ctc_batch_cost(K.zeros((2,), dtype="int32"), K.zeros((2, 3, 4)), K.zeros((2, 1)),
                         K.zeros((2, 1)))
    with pytest.raises(ValueError, match="ctc_batch_cost.*input_length"):
        K.ctc_batch_cost(K.zeros((2, 3), dtype="int32"), K.zeros((2, 3, 4)),
                         K.zeros((2, 2)), K.zeros((2, 1)))
    with pytest.raises(ValueError, match="ctc_decode.*top_paths"):
        K.ctc_decode(K.zeros((2, 3, 4)), K.zeros((2,), dtype="int32"), greedy=False,
                     beam_width=2, top_paths=3)
    with pytest.raises(ValueError, match="ctc_decode"):
        K.ctc_decode(K.zeros((2, 3, 4)), K.zeros((2,), dtype="int32"), greedy=False,
                     beam_width=0)
    with pytest.raises(ValueError, match="ctc_decode.*y_pred"):
        K.ctc_decode(K.zeros((2, 3)), K.zeros((2,), dtype="int32"))
    with pytest.raises(ValueError, match="ctc_label_dense_to_sparse.*labels"):
        K.ctc_label_dense_to_sparse(K.zeros((2,), dtype="int32"), K.zeros((2,), dtype="int32"))
    # run-time: a label value out of range, a length beyond the time axis
    f, _, _, _ = _cost_fn()
    y = softmax_rows(np.random.RandomState(6), (1, 3, 3), "float32")
    with pytest.raises(ValueError, match="label"):
        f([np.array([[3]], "int32"), y, np.array([[3]], "int32"), np.array([[1]], "int32")])
    with pytest.raises(ValueError, match="input_length"):
        f([np.array([[0]], "int32"), y, np.array([[4]], "int32"), np.array([[1]], "int32")])
    with pytest.raises(ValueError):
        K.eval(K.ctc_label_dense_to_sparse(K.constant([[1, 2]], "int32"),
                                           K.constant([3], "int32")))
