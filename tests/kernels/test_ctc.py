"""CTC kernels against slow NumPy references: brute-force path enumeration,
a plain forward algorithm, finite differences and exhaustive label search."""
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cyback.kernels.ctc import ctc_beam_decode, ctc_greedy_decode, ctc_loss

# ---------------------------------------------------------------------------
# References
# ---------------------------------------------------------------------------

def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def collapse(path, blank, merge=True):
    out, prev = [], None
    for c in path:
        if c != blank and not (merge and c == prev):
            out.append(int(c))
        prev = c
    return tuple(out)


def brute_sequence_probs(logits, T, blank):
    """p(label sequence | x) for every sequence reachable in T frames, by
    summing the probabilities of all K**T frame paths."""
    lp = log_softmax(logits[:T])
    K = lp.shape[1]
    probs = {}
    for path in itertools.product(range(K), repeat=T):
        p = np.exp(sum(lp[t, c] for t, c in enumerate(path)))
        key = collapse(path, blank)
        probs[key] = probs.get(key, 0.0) + p
    return probs


def brute_loss(logits, label, T, blank):
    p = brute_sequence_probs(logits, T, blank).get(tuple(label), 0.0)
    return np.inf if p == 0 else -np.log(p)


def numpy_forward_loss(logits, label, T, blank):
    """Plain log-space forward algorithm over the blank-extended label."""
    lp = log_softmax(logits[:T])
    ext = [blank]
    for c in label:
        ext += [int(c), blank]
    S = len(ext)
    if T == 0:
        return 0.0 if len(label) == 0 else np.inf
    a = np.full(S, -np.inf)
    a[0] = lp[0, ext[0]]
    if S > 1:
        a[1] = lp[0, ext[1]]
    for t in range(1, T):
        n = np.full(S, -np.inf)
        for s in range(S):
            terms = [a[s]]
            if s >= 1:
                terms.append(a[s - 1])
            if s >= 2 and ext[s] != blank and ext[s] != ext[s - 2]:
                terms.append(a[s - 2])
            n[s] = np.logaddexp.reduce(terms) + lp[t, ext[s]]
        a = n
    tot = np.logaddexp(a[-1], a[-2]) if S > 1 else a[-1]
    return -tot


def required_frames(label):
    return len(label) + sum(1 for i in range(1, len(label)) if label[i] == label[i - 1])


def random_case(rng, B, T, K, Lmax, blank):
    logits = rng.randn(B, T, K) * 2
    in_len = rng.randint(0, T + 1, size=B)
    labels = np.zeros((B, Lmax), dtype=np.int64)
    lab_len = np.zeros(B, dtype=np.int64)
    choices = [c for c in range(K) if c != blank]
    for b in range(B):
        n = rng.randint(0, Lmax + 1) if choices else 0
        row = rng.choice(choices, size=n) if n else np.zeros(0, np.int64)
        labels[b, :n] = row
        labels[b, n:] = rng.randint(-5, 50, size=Lmax - n)  # padding is never read
        lab_len[b] = n
    return logits, labels, in_len, lab_len


# ---------------------------------------------------------------------------
# Loss
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_loss_matches_brute_force_enumeration(dtype):
    rng = np.random.RandomState(0)
    for T in range(0, 6):
        for K in (1, 2, 3):
            labels = [lab for n in (1, 2, 3) for lab in itertools.product(range(K - 1), repeat=n)]
            for label in [()] + labels:
                logits = rng.randn(1, T, K)
                want = brute_loss(logits[0], label, T, K - 1)
                lab = np.array([list(label) + [0]], dtype=np.int64)
                loss, grad = ctc_loss(logits.astype(dtype), lab, [T], [len(label)])
                assert loss.dtype == dtype and grad.dtype == dtype
                assert not np.any(np.isnan(grad))
                if np.isinf(want):
                    assert np.isinf(loss[0]) and loss[0] > 0
                    assert np.all(grad == 0)
                else:
                    tol = 1e-10 if dtype == np.float64 else 1e-5
                    np.testing.assert_allclose(loss[0], want, rtol=tol, atol=tol)


def test_loss_with_other_blank_index():
    rng = np.random.RandomState(1)
    for T in (3, 4):
        logits = rng.randn(2, T, 3)
        labels = np.array([[1, 2], [2, 2]])
        loss, _ = ctc_loss(logits, labels, [T, T], [2, 1], blank=0)
        for b in range(2):
            want = brute_loss(logits[b], labels[b, :[2, 1][b]], T, 0)
            np.testing.assert_allclose(loss[b], want, rtol=1e-10)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), B=st.integers(1, 5), T=st.integers(1, 30),
       K=st.integers(2, 7), Lmax=st.integers(0, 8), dtype=st.sampled_from([np.float32, np.float64]))
def test_loss_matches_numpy_forward(seed, B, T, K, Lmax, dtype):
    rng = np.random.RandomState(seed)
    logits, labels, in_len, lab_len = random_case(rng, B, T, K, Lmax, K - 1)
    loss, grad = ctc_loss(logits.astype(dtype), labels, in_len, lab_len)
    for b in range(B):
        lab = labels[b, :lab_len[b]]
        want = numpy_forward_loss(logits[b], lab, in_len[b], K - 1)
        if np.isinf(want) or in_len[b] < required_frames(lab):
            assert np.isposinf(loss[b])
            assert np.all(grad[b] == 0)
        else:
            tol = 1e-9 if dtype == np.float64 else 2e-5
            np.testing.assert_allclose(loss[b], want, rtol=tol, atol=tol)
            # Softmax and posterior occupancy both sum to one per frame.
            np.testing.assert_allclose(grad[b, :in_len[b]].sum(-1), 0, atol=tol * 10)
        assert np.all(grad[b, in_len[b]:] == 0)


def test_gradient_matches_finite_differences():
    rng = np.random.RandomState(2)
    B, T, K = 3, 7, 4
    logits = rng.randn(B, T, K)
    labels = np.array([[0, 1, 1], [2, 0, 0], [1, 2, 0]])
    in_len = np.array([7, 6, 5])
    lab_len = np.array([3, 1, 2])
    _, grad = ctc_loss(logits, labels, in_len, lab_len)
    eps = 1e-6
    num = np.zeros_like(logits)
    for idx in np.ndindex(*logits.shape):
        xp = logits.copy()
        xp[idx] += eps
        xm = logits.copy()
        xm[idx] -= eps
        num[idx] = (ctc_loss(xp, labels, in_len, lab_len)[0][idx[0]]
                    - ctc_loss(xm, labels, in_len, lab_len)[0][idx[0]]) / (2 * eps)
    np.testing.assert_allclose(grad, num, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("blank", [3, 0])
def test_labels_equal_to_the_blank_follow_tensorflow(blank):
    """TF accepts a label equal to the blank index (Keras's OCR example labels
    blank images [blank]): an ordinary state of the extended label emitting the
    blank class, never skipped over. Finite losses, the same recursion as the
    reference, and gradients that match finite differences."""
    rng = np.random.RandomState(3)
    B, T, K = 5, 6, 4
    logits = rng.randn(B, T, K)
    other = 1 if blank == 0 else 0
    labels = np.array([[blank, 0, 0], [other, blank, 2], [blank, blank, 0],
                       [blank, other, blank], [2, blank, 2]])
    lab_len = np.array([1, 3, 2, 3, 3])
    in_len = np.array([6, 6, 3, 5, 6])
    loss, grad = ctc_loss(logits, labels, in_len, lab_len, blank=blank)
    assert np.all(np.isfinite(loss))
    for b in range(B):
        want = numpy_forward_loss(logits[b], labels[b, :lab_len[b]], in_len[b], blank)
        np.testing.assert_allclose(loss[b], want, rtol=1e-10)
    eps = 1e-6
    num = np.zeros_like(logits)
    for idx in np.ndindex(*logits.shape):
        xp, xm = logits.copy(), logits.copy()
        xp[idx] += eps
        xm[idx] -= eps
        num[idx] = (ctc_loss(xp, labels, in_len, lab_len, blank=blank)[0][idx[0]]
                    - ctc_loss(xm, labels, in_len, lab_len, blank=blank)[0][idx[0]]) / (2 * eps)
    np.testing.assert_allclose(grad, num, atol=1e-7, rtol=1e-6)
    # [blank, blank] needs three frames, like any repeated label.
    short, _ = ctc_loss(logits[:1, :2], np.array([[blank, blank]]), [2], [2], blank=blank)
    assert np.isinf(short[0])


def test_gradient_float32_close_to_float64():
    rng = np.random.RandomState(3)
    logits = rng.randn(4, 40, 9)
    labels = rng.randint(0, 8, size=(4, 12))
    args = (labels, [40, 33, 40, 25], [12, 5, 0, 9])
    l64, g64 = ctc_loss(logits, *args)
    l32, g32 = ctc_loss(logits.astype(np.float32), *args)
    np.testing.assert_allclose(l32, l64, rtol=1e-5)
    np.testing.assert_allclose(g32, g64, atol=1e-5)


def test_repeated_labels_need_a_blank():
    rng = np.random.RandomState(4)
    logits = rng.randn(3, 4, 3)
    labels = np.array([[1, 1, 1], [1, 1, 0], [0, 1, 0]])
    # "1 1 1" needs 5 frames, "1 1" needs 3, "0 1 0" needs 3.
    loss, grad = ctc_loss(logits, labels, [4, 2, 3], [3, 2, 3])
    assert np.isposinf(loss[0]) and np.all(grad[0] == 0)
    assert np.isposinf(loss[1]) and np.all(grad[1] == 0)
    np.testing.assert_allclose(loss[2], brute_loss(logits[2], [0, 1, 0], 3, 2), rtol=1e-10)
    loss, _ = ctc_loss(logits[1:2], labels[1:2], [3], [2])
    np.testing.assert_allclose(loss[0], brute_loss(logits[1], [1, 1], 3, 2), rtol=1e-10)


def test_label_length_zero_is_all_blank():
    rng = np.random.RandomState(5)
    logits = rng.randn(2, 6, 5)
    loss, grad = ctc_loss(logits, np.zeros((2, 0), np.int64), [6, 3], [0, 0])
    lp = log_softmax(logits)
    np.testing.assert_allclose(loss, [-lp[0, :, 4].sum(), -lp[1, :3, 4].sum()], rtol=1e-12)
    want = np.exp(lp)
    want[..., 4] -= 1
    want[1, 3:] = 0
    np.testing.assert_allclose(grad, want, atol=1e-12)


def test_frames_after_input_length_are_ignored():
    rng = np.random.RandomState(6)
    logits = rng.randn(2, 9, 4)
    labels = np.array([[0, 2], [1, 0]])
    l1, g1 = ctc_loss(logits, labels, [5, 9], [2, 2])
    logits2 = logits.copy()
    logits2[0, 5:] = rng.randn(4, 4) * 100
    l2, g2 = ctc_loss(logits2, labels, [5, 9], [2, 2])
    np.testing.assert_array_equal(l1, l2)
    np.testing.assert_array_equal(g1, g2)
    assert np.all(g1[0, 5:] == 0)
    np.testing.assert_allclose(l1[0], numpy_forward_loss(logits[0], [0, 2], 5, 3), rtol=1e-12)


def test_long_sequences_stay_finite():
    rng = np.random.RandomState(7)
    T, K, L = 3000, 20, 400
    # Peaked, softmax-like scores as Keras passes them: log(y_pred + 1e-7).
    y = rng.dirichlet(np.full(K, 0.05), size=(2, T))
    logits = np.log(y + 1e-7)
    labels = rng.randint(0, K - 1, size=(2, L))
    for dtype in (np.float64, np.float32):
        loss, grad = ctc_loss(logits.astype(dtype), labels, [T, T], [L, L // 2])
        assert np.all(np.isfinite(loss)) and np.all(loss > 0)
        assert np.all(np.isfinite(grad))
        np.testing.assert_allclose(grad.astype(np.float64).sum(-1), 0, atol=1e-4)
    # Reference on a shorter slice, where the plain NumPy loop is still quick.
    loss, _ = ctc_loss(logits[:1, :300], labels[:1], [300], [40])
    want = numpy_forward_loss(logits[0, :300], labels[0, :40], 300, K - 1)
    np.testing.assert_allclose(loss[0], want, rtol=1e-10)


def test_loss_edge_shapes_and_layouts():
    rng = np.random.RandomState(8)
    loss, grad = ctc_loss(np.zeros((0, 5, 3)), np.zeros((0, 2), np.int64), [], [])
    assert loss.shape == (0,) and grad.shape == (0, 5, 3)
    loss, grad = ctc_loss(np.zeros((2, 0, 3)), np.zeros((2, 1), np.int64), [0, 0], [0, 1])
    assert list(loss) == [0, np.inf] and grad.shape == (2, 0, 3)
    # Time-major storage viewed batch-major, (B, 1) lengths, int32 labels.
    base = rng.randn(6, 3, 5)
    logits = base.transpose(1, 0, 2)
    assert not logits.flags.c_contiguous
    labels = rng.randint(0, 4, size=(3, 4)).astype(np.int32)[:, ::-1]
    in_len = np.array([[6], [5], [6]])
    lab_len = np.array([[2], [3], [1]])
    loss, grad = ctc_loss(logits, labels, in_len, lab_len)
    loss_c, grad_c = ctc_loss(np.ascontiguousarray(logits), np.ascontiguousarray(labels),
                              in_len.ravel(), lab_len.ravel())
    np.testing.assert_array_equal(loss, loss_c)
    np.testing.assert_array_equal(grad, grad_c)


def test_float_labels_and_lengths_as_keras_passes_them():
    rng = np.random.RandomState(15)
    logits = rng.randn(2, 6, 4).astype(np.float32)
    labels = np.array([[0, 2, np.nan], [1, -1, -1]], dtype=np.float32)  # junk padding
    loss, grad = ctc_loss(logits, labels, np.array([[6.0], [5.0]], np.float32),
                          np.array([[2.0], [1.0]], np.float32))
    want, wgrad = ctc_loss(logits, [[0, 2], [1, 0]], [6, 5], [2, 1])
    np.testing.assert_array_equal(loss, want)
    np.testing.assert_array_equal(grad, wgrad)


def test_loss_float16_input():
    rng = np.random.RandomState(9)
    logits = rng.randn(2, 5, 3).astype(np.float16)
    loss, grad = ctc_loss(logits, [[0, 1], [1, 0]], [5, 5], [2, 2])
    assert loss.dtype == np.float16 and grad.dtype == np.float16
    want, _ = ctc_loss(logits.astype(np.float64), [[0, 1], [1, 0]], [5, 5], [2, 2])
    np.testing.assert_allclose(loss.astype(np.float64), want, rtol=2e-3)


def test_loss_bad_arguments():
    x = np.zeros((2, 5, 4))
    lab = np.array([[0, 1], [2, 0]])
    ok = dict(input_lengths=[5, 5], label_lengths=[2, 2])
    ctc_loss(x, lab, **ok)
    with pytest.raises(ValueError, match="ctc_loss"):
        ctc_loss(x[0], lab, **ok)
    with pytest.raises(TypeError, match="ctc_loss"):
        ctc_loss(x.astype(np.int32), lab, **ok)
    with pytest.raises(ValueError, match="ctc_loss"):
        ctc_loss(x, lab[:1], **ok)
    with pytest.raises(ValueError, match="label values"):
        ctc_loss(x, np.array([[0, -1], [2, 0]]), **ok)
    with pytest.raises(ValueError, match="label values"):
        ctc_loss(x, np.array([[0, 1], [2, 7]]), **ok)
    ctc_loss(x, np.array([[0, 1], [2, 7]]), [5, 5], [2, 1])  # padding is not checked
    with pytest.raises(ValueError, match="input_lengths"):
        ctc_loss(x, lab, [6, 5], [2, 2])
    with pytest.raises(ValueError, match="input_lengths"):
        ctc_loss(x, lab, [-1, 5], [2, 2])
    with pytest.raises(ValueError, match="input_lengths"):
        ctc_loss(x, lab, [5, 5, 5], [2, 2])
    with pytest.raises(ValueError, match="label_lengths"):
        ctc_loss(x, lab, [5, 5], [3, 2])
    with pytest.raises(ValueError, match="whole numbers"):
        ctc_loss(x, lab.astype(np.float64) + 0.5, **ok)
    with pytest.raises(TypeError, match="labels"):
        ctc_loss(x, lab.astype(np.complex128), **ok)
    with pytest.raises(ValueError, match="whole numbers"):
        ctc_loss(x, lab, [4.5, 5], [2, 2])
    with pytest.raises(ValueError, match="blank"):
        ctc_loss(x, lab, blank=4, **ok)
    with pytest.raises(ValueError, match="at least one class"):
        ctc_loss(np.zeros((2, 5, 0)), lab, **ok)


# ---------------------------------------------------------------------------
# Greedy decoding
# ---------------------------------------------------------------------------

def greedy_reference(x, in_len, merge, blank):
    seqs, scores = [], []
    for b in range(x.shape[0]):
        best = [int(np.argmax(x[b, t])) for t in range(in_len[b])]
        seqs.append(collapse(best, blank, merge))
        scores.append(-sum(float(x[b, t].max()) for t in range(in_len[b])))
    n = max([len(s) for s in seqs] + [0])
    out = np.full((x.shape[0], n), -1, dtype=np.int64)
    for b, s in enumerate(seqs):
        out[b, :len(s)] = s
    return out, np.array(scores).reshape(-1, 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("merge", [True, False])
def test_greedy_matches_python_loop(dtype, merge):
    rng = np.random.RandomState(10)
    for B, T, K in [(1, 1, 1), (1, 7, 3), (5, 13, 4), (9, 40, 11)]:
        # Few distinct values so that repeats and ties are common.
        x = rng.randint(0, 3, size=(B, T, K)).astype(dtype) + rng.rand(B, T, K).astype(dtype) * 0.1
        in_len = rng.randint(0, T + 1, size=B)
        for blank in (-1, 0):
            dec, lp = ctc_greedy_decode(x, in_len, merge_repeated=merge, blank=blank)
            want, want_lp = greedy_reference(x, in_len, merge, blank % K)
            np.testing.assert_array_equal(dec, want)
            assert dec.dtype == np.int64 and lp.dtype == dtype and lp.shape == (B, 1)
            np.testing.assert_allclose(lp, want_lp, rtol=1e-5 if dtype == np.float32 else 1e-12)


def test_greedy_merge_semantics_and_edges():
    K = 3  # blank = 2
    frames = [0, 0, 2, 0, 1, 1, 2, 2, 1]
    x = np.full((1, len(frames), K), -5.0)
    x[0, np.arange(len(frames)), frames] = 0.0
    dec, lp = ctc_greedy_decode(x, [len(frames)])
    assert dec.tolist() == [[0, 0, 1, 1]]
    assert lp[0, 0] == 0.0
    dec, _ = ctc_greedy_decode(x, [len(frames)], merge_repeated=False)
    assert dec.tolist() == [[0, 0, 0, 1, 1, 1]]
    dec, lp = ctc_greedy_decode(np.zeros((0, 4, 3)), [])
    assert dec.shape == (0, 0) and lp.shape == (0, 1)
    dec, lp = ctc_greedy_decode(x, [0])
    assert dec.shape == (1, 0) and lp[0, 0] == 0
    # Non-contiguous input.
    xt = np.ascontiguousarray(np.concatenate([x, x[:, ::-1]]).transpose(1, 0, 2)).transpose(1, 0, 2)
    dec, _ = ctc_greedy_decode(xt, np.array([[9], [9]]))
    assert dec.tolist()[0] == [0, 0, 1, 1]


def test_greedy_bad_arguments():
    with pytest.raises(ValueError, match="ctc_greedy_decode"):
        ctc_greedy_decode(np.zeros((2, 3)), [3, 3])
    with pytest.raises(ValueError, match="input_lengths"):
        ctc_greedy_decode(np.zeros((2, 3, 4)), [4, 3])
    with pytest.raises(ValueError, match="input_lengths"):
        ctc_greedy_decode(np.zeros((2, 3, 4)), [3])
    with pytest.raises(TypeError):
        ctc_greedy_decode(np.zeros((2, 3, 4), dtype=np.int64), [3, 3])
    with pytest.raises(ValueError, match="blank"):
        ctc_greedy_decode(np.zeros((2, 3, 4)), [3, 3], blank=-5)


# ---------------------------------------------------------------------------
# Beam search
# ---------------------------------------------------------------------------

def exhaustive_top(logits, T, blank, k):
    probs = brute_sequence_probs(logits, T, blank)
    ranked = sorted(probs.items(), key=lambda kv: -kv[1])
    return ranked[:k]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_beam_wide_enough_is_exact(dtype):
    """With a beam wider than the number of possible prefixes nothing is
    pruned, so the top paths are exactly the most probable label sequences."""
    rng = np.random.RandomState(11)
    for T, K in [(1, 2), (3, 3), (4, 3), (5, 3), (4, 4), (6, 2)]:
        B = 3
        logits = rng.randn(B, T, K) * 1.5
        in_len = np.array([T, max(T - 1, 0), T])
        top = 4
        dec, lp = ctc_beam_decode(logits.astype(dtype), in_len, beam_width=200, top_paths=top)
        assert len(dec) == top and lp.shape == (B, top) and lp.dtype == dtype
        for b in range(B):
            want = exhaustive_top(logits[b], in_len[b], K - 1, top)
            for p in range(top):
                row = dec[p][b]
                got = tuple(int(v) for v in row[row >= 0])
                if p < len(want):
                    tol = 1e-9 if dtype == np.float64 else 1e-5
                    np.testing.assert_allclose(lp[b, p], np.log(want[p][1]), rtol=tol, atol=tol)
                    assert got == want[p][0], (T, K, b, p)
                else:
                    assert got == () and np.isneginf(lp[b, p])


def test_beam_top1_usually_matches_exhaustive_with_small_beam():
    rng = np.random.RandomState(12)
    hits = 0
    for _ in range(20):
        logits = rng.randn(1, 5, 3) * 2
        dec, lp = ctc_beam_decode(logits, [5], beam_width=4, top_paths=2)
        want = exhaustive_top(logits[0], 5, 2, 1)[0]
        got = tuple(int(v) for v in dec[0][0] if v >= 0)
        hits += got == want[0]
        assert lp[0, 0] >= lp[0, 1]
        assert lp[0, 0] <= np.log(want[1]) + 1e-9   # a beam score never exceeds the truth
    assert hits >= 16


def test_beam_scores_are_sequence_probabilities():
    """Beam log-probabilities equal -ctc_loss of the decoded sequence when the
    beam is wide (no alignment of the prefix was pruned)."""
    rng = np.random.RandomState(13)
    logits = rng.randn(4, 8, 4)
    in_len = np.array([8, 6, 3, 8])
    dec, lp = ctc_beam_decode(logits, in_len, beam_width=2000, top_paths=3)
    for p in range(3):
        for b in range(4):
            seq = dec[p][b][dec[p][b] >= 0]
            lab = np.zeros((1, max(len(seq), 1)), np.int64)
            lab[0, :len(seq)] = seq
            loss, _ = ctc_loss(logits[b:b + 1], lab, in_len[b:b + 1], [len(seq)])
            np.testing.assert_allclose(lp[b, p], -loss[0], rtol=1e-10)


def test_beam_merge_repeated_and_blank_index():
    K = 3
    frames = [0, 2, 0, 1]           # "a _ a b" -> labels (0, 0, 1)
    x = np.full((1, 4, K), -30.0)
    x[0, np.arange(4), frames] = 0.0
    dec, _ = ctc_beam_decode(x, [4], beam_width=5)
    assert dec[0].tolist() == [[0, 0, 1]]
    dec, _ = ctc_beam_decode(x, [4], beam_width=5, merge_repeated=True)
    assert dec[0].tolist() == [[0, 1]]
    # Same scores with the blank moved to class 0.
    y = x[..., [2, 0, 1]]
    dec, _ = ctc_beam_decode(y, [4], beam_width=5, blank=0)
    assert dec[0].tolist() == [[1, 1, 2]]


def test_beam_edges_and_layouts():
    rng = np.random.RandomState(14)
    dec, lp = ctc_beam_decode(np.zeros((0, 5, 3)), [], top_paths=2, beam_width=3)
    assert [d.shape for d in dec] == [(0, 0), (0, 0)] and lp.shape == (0, 2)
    dec, lp = ctc_beam_decode(np.zeros((2, 0, 3)), [0, 0], top_paths=2, beam_width=3)
    assert dec[0].shape == (2, 0) and lp[:, 0].tolist() == [0, 0] and np.all(np.isneginf(lp[:, 1]))
    base = rng.randn(7, 3, 5)
    x = base.transpose(1, 0, 2)
    in_len = np.array([[7], [4], [1]])
    dec1, lp1 = ctc_beam_decode(x, in_len, beam_width=10, top_paths=3)
    dec2, lp2 = ctc_beam_decode(np.ascontiguousarray(x), in_len.ravel(), beam_width=10, top_paths=3)
    for a, b in zip(dec1, dec2):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(lp1, lp2)
    # Beam width 1 follows the single best prefix: same as greedy for peaked inputs.
    x = np.log(rng.dirichlet(np.full(6, 0.02), size=(4, 30)) + 1e-7)
    dec, _ = ctc_beam_decode(x, [30] * 4, beam_width=1)
    gdec, _ = ctc_greedy_decode(x, [30] * 4)
    assert dec[0].shape[0] == 4
    assert np.mean([np.array_equal(dec[0][b][dec[0][b] >= 0], gdec[b][gdec[b] >= 0])
                    for b in range(4)]) >= 0.5


def test_beam_bad_arguments():
    x = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match="beam_width"):
        ctc_beam_decode(x, [3, 3], beam_width=0)
    with pytest.raises(ValueError, match="top_paths"):
        ctc_beam_decode(x, [3, 3], beam_width=2, top_paths=3)
    with pytest.raises(ValueError, match="top_paths"):
        ctc_beam_decode(x, [3, 3], top_paths=0)
    with pytest.raises(ValueError, match="input_lengths"):
        ctc_beam_decode(x, [3, 4])
    with pytest.raises(ValueError, match="ctc_beam_decode"):
        ctc_beam_decode(x[0], [3, 3])
    with pytest.raises(TypeError):
        ctc_beam_decode(x.astype(np.int16), [3, 3])


def test_threaded_and_serial_paths_agree_bitwise(monkeypatch):
    import cyback.kernels.ctc as ctc_mod
    rng = np.random.RandomState(16)
    logits, labels, in_len, lab_len = random_case(rng, 7, 40, 6, 9, 5)
    monkeypatch.setattr(ctc_mod, "PAR_CELLS", 0)
    l1, g1 = ctc_loss(logits, labels, in_len, lab_len)
    monkeypatch.setattr(ctc_mod, "PAR_CELLS", 1 << 62)
    l2, g2 = ctc_loss(logits, labels, in_len, lab_len)
    np.testing.assert_array_equal(l1, l2)
    np.testing.assert_array_equal(g1, g2)


def python_prefix_beam(logits, T, width, blank, top):
    """Plain prefix beam search: dicts of prefix -> (log P blank-ending,
    log P label-ending), keeping the `width` best totals after every frame."""
    lp = log_softmax(logits[:T])
    beams = {(): (0.0, -np.inf)}
    for t in range(T):
        nxt = {}
        for pre, (pb, pnb) in beams.items():
            tot = np.logaddexp(pb, pnb)
            ob, onb = nxt.get(pre, (-np.inf, -np.inf))
            ob = np.logaddexp(ob, tot + lp[t, blank])
            if pre:
                onb = np.logaddexp(onb, pnb + lp[t, pre[-1]])
            nxt[pre] = (ob, onb)
            for c in range(lp.shape[1]):
                if c == blank:
                    continue
                new = pre + (c,)
                src = pb if pre and pre[-1] == c else tot
                eb, enb = nxt.get(new, (-np.inf, -np.inf))
                nxt[new] = (eb, np.logaddexp(enb, src + lp[t, c]))
        ranked = sorted(nxt.items(), key=lambda kv: -np.logaddexp(*kv[1]))
        beams = dict(kv for kv in ranked[:width] if np.logaddexp(*kv[1]) > -np.inf)
    ranked = sorted(beams.items(), key=lambda kv: -np.logaddexp(*kv[1]))
    return [(k, np.logaddexp(*v)) for k, v in ranked[:top]]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), T=st.integers(1, 12), K=st.integers(2, 6),
       width=st.integers(1, 12), peaked=st.booleans())
def test_beam_matches_python_prefix_beam_search(seed, T, K, width, peaked):
    rng = np.random.RandomState(seed)
    if peaked:
        x = np.log(rng.dirichlet(np.full(K, 0.2), size=(2, T)) + 1e-7)
    else:
        x = rng.randn(2, T, K)
    in_len = np.array([T, rng.randint(0, T + 1)])
    top = min(3, width)
    dec, lp = ctc_beam_decode(x, in_len, beam_width=width, top_paths=top)
    for b in range(2):
        want = python_prefix_beam(x[b], in_len[b], width, K - 1, top)
        for p in range(top):
            got = tuple(int(v) for v in dec[p][b] if v >= 0)
            if p < len(want):
                np.testing.assert_allclose(lp[b, p], want[p][1], rtol=1e-9, atol=1e-9)
                # Equal scores may come out in either order; compare the set of ties.
                ties = {k for k, s in want if abs(s - want[p][1]) < 1e-9}
                assert got in ties, (b, p, got, want)
            else:
                assert got == () and np.isneginf(lp[b, p])


def test_non_finite_scores_do_not_crash():
    rng = np.random.RandomState(17)
    x = rng.randn(3, 12, 5)
    x[0, 3, 2] = np.nan
    x[1, :, :] = np.nan
    x[2, 4, 1] = np.inf
    for bw in (1, 3, 50):
        dec, lp = ctc_beam_decode(x, [12, 12, 12], beam_width=bw, top_paths=1)
        assert dec[0].shape[0] == 3 and lp.shape == (3, 1)
    ctc_greedy_decode(x, [12, 12, 12])
    loss, grad = ctc_loss(x, np.array([[0, 1], [1, 2], [3, 3]]), [12, 12, 12], [2, 2, 2])
    assert loss.shape == (3,) and grad.shape == x.shape
