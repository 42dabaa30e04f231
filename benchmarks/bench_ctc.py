"""CTC kernels: loss+gradient, greedy and beam decoding, against NumPy and PyTorch.

Run: python benchmarks/bench_ctc.py [--repeats N] [--quick]
Prints median milliseconds per call and writes benchmarks/results/ctc.json.
"""
import argparse
import json
import os
import platform
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cyback.kernels.ctc import ctc_beam_decode, ctc_greedy_decode, ctc_loss  # noqa: E402
from cyback.kernels.runtime import get_max_threads  # noqa: E402

from _common import median_time  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
except Exception:  # torch is optional
    torch = None


def median_ms(fn, repeats, warmup=1):
    return median_time(fn, repeats, warmup) * 1e3


# ---------------------------------------------------------------------------
# NumPy references (vectorised over batch and states, a Python loop over time)
# ---------------------------------------------------------------------------

def np_log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def np_ctc_loss_grad(logits, labels, in_len, lab_len):
    B, T, K = logits.shape
    blank = K - 1
    lp = np_log_softmax(logits.astype(np.float64))
    L = int(lab_len.max())
    S = 2 * L + 1
    ext = np.full((B, S), blank)
    ext[:, 1::2] = labels[:, :L]
    valid = np.arange(S)[None, :] < (2 * lab_len + 1)[:, None]
    ext = np.where(valid, ext, blank)
    skip = np.zeros((B, S), bool)
    skip[:, 3::2] = ext[:, 3::2] != ext[:, 1:-2:2]
    em = np.take_along_axis(lp, np.broadcast_to(ext[:, None, :], (B, T, S)), axis=2)
    em = np.where(valid[:, None, :], em, -np.inf)
    ninf = np.full((B, 2), -np.inf)
    alpha = np.full((T, B, S), -np.inf)
    alpha[0, :, 0] = em[:, 0, 0]
    alpha[0, :, 1] = em[:, 0, 1]
    for t in range(1, T):
        a = alpha[t - 1]
        a1 = np.concatenate([ninf[:, :1], a[:, :-1]], 1)
        a2 = np.where(skip, np.concatenate([ninf, a[:, :-2]], 1), -np.inf)
        alpha[t] = np.logaddexp(np.logaddexp(a, a1), a2) + em[:, t]
    bidx = np.arange(B)
    last = alpha[in_len - 1, bidx]
    end = 2 * lab_len
    logp = np.logaddexp(last[bidx, end],
                        np.where(lab_len > 0, last[bidx, np.maximum(end - 1, 0)], -np.inf))
    beta = np.full((T, B, S), -np.inf)
    for t in range(T - 1, -1, -1):
        cur = np.full((B, S), -np.inf)
        fin = in_len - 1 == t
        cur[fin, end[fin]] = 0.0
        cur[fin & (lab_len > 0), np.maximum(end - 1, 0)[fin & (lab_len > 0)]] = 0.0
        if t < T - 1:
            be = beta[t + 1] + em[:, t + 1]
            b1 = np.concatenate([be[:, 1:], ninf[:, :1]], 1)
            b2 = np.where(np.concatenate([skip[:, 2:], np.zeros((B, 2), bool)], 1),
                          np.concatenate([be[:, 2:], ninf], 1), -np.inf)
            live = (t < in_len - 1)[:, None]
            cur = np.where(live, np.logaddexp(np.logaddexp(be, b1), b2), cur)
        beta[t] = cur
    with np.errstate(invalid="ignore"):
        occ_s = np.exp(alpha + beta - logp[None, :, None])           # (T, B, S)
    occ_s = np.nan_to_num(occ_s)
    onehot = np.zeros((B, S, K))
    onehot[bidx[:, None], np.arange(S)[None, :], ext] = 1.0
    occ = np.einsum("tbs,bsk->btk", occ_s, onehot)
    grad = np.exp(lp) - occ
    grad[np.arange(T)[None, :] >= in_len[:, None]] = 0
    return -logp, grad


def np_greedy(x, in_len):
    best = x.argmax(-1)
    blank = x.shape[2] - 1
    out = []
    for b in range(x.shape[0]):
        seq, prev = [], -1
        for c in best[b, :in_len[b]]:
            if c != blank and c != prev:
                seq.append(int(c))
            prev = c
        out.append(seq)
    return out, -np.take_along_axis(x, best[..., None], 2)[..., 0].sum(1)


def np_beam(x, in_len, width):
    blank = x.shape[2] - 1
    lp_all = np_log_softmax(x.astype(np.float64))
    res = []
    for b in range(x.shape[0]):
        beams = {(): (0.0, -np.inf)}
        for t in range(in_len[b]):
            lp = lp_all[b, t]
            nxt = {}
            for pre, (pb, pnb) in beams.items():
                tot = np.logaddexp(pb, pnb)
                ob, onb = nxt.get(pre, (-np.inf, -np.inf))
                ob = np.logaddexp(ob, tot + lp[blank])
                if pre:
                    onb = np.logaddexp(onb, pnb + lp[pre[-1]])
                nxt[pre] = (ob, onb)
                for c in range(x.shape[2]):
                    if c == blank:
                        continue
                    new = pre + (c,)
                    src = pb if pre and pre[-1] == c else tot
                    eb, enb = nxt.get(new, (-np.inf, -np.inf))
                    nxt[new] = (eb, np.logaddexp(enb, src + lp[c]))
            beams = dict(sorted(nxt.items(), key=lambda kv: -np.logaddexp(*kv[1]))[:width])
        res.append(max(beams.items(), key=lambda kv: np.logaddexp(*kv[1]))[0])
    return res


# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------

def make_case(B, T, K, L, dtype, seed=0):
    rng = np.random.RandomState(seed)
    y = rng.dirichlet(np.full(K, 0.3), size=(B, T))
    logits = np.log(y + 1e-7).astype(dtype)    # what Keras hands to the loss
    lab_len = np.clip(rng.randint(L - L // 5, L + L // 5 + 1, size=B), 1, None)
    labels = rng.randint(0, K - 1, size=(B, int(lab_len.max())))
    in_len = np.full(B, T)
    return logits, labels, in_len, lab_len


def torch_loss_fn(logits, labels, in_len, lab_len):
    K = logits.shape[2]
    x = torch.from_numpy(np.ascontiguousarray(logits))
    tg = torch.from_numpy(labels.astype(np.int64))
    il = torch.from_numpy(in_len.astype(np.int64))
    tl = torch.from_numpy(lab_len.astype(np.int64))

    def run():
        xr = x.detach().requires_grad_(True)
        lp = F.log_softmax(xr, dim=2).transpose(0, 1)
        loss = F.ctc_loss(lp, tg, il, tl, blank=K - 1, reduction="none")
        loss.sum().backward()
        return loss, xr.grad
    return run


def api_loss_fn(logits, labels, in_len, lab_len):
    """K.ctc_batch_cost and its gradient with respect to the softmax output,
    through a compiled K.function (what a Keras model's training step runs)."""
    import cyback as K
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs = (probs / probs.sum(-1, keepdims=True)).astype(logits.dtype)
    dtype = np.dtype(logits.dtype).name
    y_true = K.placeholder((None, None), dtype="int32")
    y_pred = K.placeholder((None, None, logits.shape[2]), dtype=dtype)
    il = K.placeholder((None, 1), dtype="int32")
    ll = K.placeholder((None, 1), dtype="int32")
    cost = K.ctc_batch_cost(y_true, y_pred, il, ll)
    f = K.function([y_true, y_pred, il, ll], [cost] + K.gradients(K.sum(cost), [y_pred]))
    feeds = [labels.astype("int32"), probs, in_len.reshape(-1, 1).astype("int32"),
             lab_len.reshape(-1, 1).astype("int32")]
    return lambda: f(feeds)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--quick", action="store_true",
                    help="3 repeats, and skip the pure-Python beam reference (~20 s)")
    args = ap.parse_args()
    R = 3 if args.quick else args.repeats
    if torch is not None:
        torch.set_num_threads(get_max_threads())
    # Each library runs in its own phase: OpenMP pools (ours and torch's
    # bundled one) keep spinning for a while after a parallel region, and two
    # pools spinning on 2 cores at once would slow whichever runs next.
    cases = []   # (op, shape, dtype, ours, numpy ref or None, torch or None, repeats)
    for (B, T, K, L), reps in [((16, 50, 30, 10), R), ((8, 1000, 80, 100), max(3, R // 3))]:
        for dtype in (np.float32, np.float64):
            c = make_case(B, T, K, L, dtype)
            cases.append(("loss+grad", "B=%d T=%d K=%d L~%d" % (B, T, K, L), dtype,
                          (lambda c=c: ctc_loss(*c)), (lambda c=c: np_ctc_loss_grad(*c)),
                          torch_loss_fn(*c) if torch is not None else None, reps))
            cases.append(("K.ctc+grad", "B=%d T=%d K=%d L~%d" % (B, T, K, L), dtype,
                          api_loss_fn(*c), None, None, reps))
    B, T, K = 16, 50, 30
    for dtype in (np.float32, np.float64):
        x, _, in_len, _ = make_case(B, T, K, 10, dtype)
        cases.append(("greedy", "B=%d T=%d K=%d" % (B, T, K), dtype,
                      (lambda x=x, n=in_len: ctc_greedy_decode(x, n)),
                      (lambda x=x, n=in_len: np_greedy(x, n)), None, R))
        # The pure-Python beam reference takes seconds: time it once, float32 only.
        cases.append(("beam100", "B=%d T=%d K=%d" % (B, T, K), dtype,
                      (lambda x=x, n=in_len: ctc_beam_decode(x, n, beam_width=100)),
                      (lambda x=x, n=in_len: np_beam(x, n, 100))
                      if dtype == np.float32 and not args.quick else None,
                      None, R))
    ours = [median_ms(c[3], c[6]) for c in cases]
    refs = [None if c[4] is None else
            median_ms(c[4], 1 if c[0] == "beam100" else max(1, c[6] // 5),
                      warmup=0 if c[0] == "beam100" else 1) for c in cases]
    tms = [None if c[5] is None else median_ms(c[5], c[6]) for c in cases]
    rows = []
    for c, o, r, tm in zip(cases, ours, refs, tms):
        rows.append(dict(op=c[0], shape=c[1], dtype=np.dtype(c[2]).name, cyback_ms=o,
                         numpy_ms=r, torch_ms=tm,
                         numpy_ratio=None if r is None else r / o,
                         torch_ratio=None if tm is None else tm / o))

    def fmt(v, spec):
        return "-" if v is None else format(v, spec)
    print("threads=%d torch=%s" % (get_max_threads(), torch.__version__ if torch else "absent"))
    head = "%-10s %-22s %-8s %10s %10s %8s %10s %8s" % (
        "op", "shape", "dtype", "cyback ms", "numpy ms", "x numpy", "torch ms", "x torch")
    print(head)
    print("-" * len(head))
    for r in rows:
        print("%-10s %-22s %-8s %10s %10s %8s %10s %8s" % (
            r["op"], r["shape"], r["dtype"], fmt(r["cyback_ms"], ".3f"), fmt(r["numpy_ms"], ".2f"),
            fmt(r["numpy_ratio"], ".1f"), fmt(r["torch_ms"], ".3f"), fmt(r["torch_ratio"], ".2f")))
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "ctc.json"), "w") as f:
        json.dump(dict(benchmark="ctc", threads=get_max_threads(), python=platform.python_version(),
                       numpy=np.__version__, torch=torch.__version__ if torch else None,
                       repeats=R, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
