"""CTC ops over the kernels in cyback.kernels.ctc: the loss with its gradient
(one forward-backward pass gives both) and greedy/beam decoding."""
import numpy as np

from cyback.graph.op import Op
from cyback.kernels import ctc as kernels
from cyback.ops.shape import reshape_static_dims


def _writable(a):
    # The kernels take non-const memoryviews, which refuse read-only buffers
    # (folded constants are read-only).
    a = np.asarray(a)
    return a if a.flags.writeable else a.copy()


class CTCLoss(Op):
    """(loss (B,), d loss / d logits (B, T, K)) for logits (B, T, K)."""

    api = "ctc_batch_cost"
    n_outputs = 2

    def infer(self, logits, labels, input_length, label_length):
        if logits.ndim != 3:
            raise ValueError("ctc_batch_cost: y_pred must be (samples, time_steps, num_categories),"
                             " got shape %s" % (logits.shape,))
        if labels.ndim != 2:
            raise ValueError("ctc_batch_cost: y_true must be (samples, max_string_length), got "
                             "shape %s" % (labels.shape,))
        return [((logits.shape[0],), logits.dtype), (logits.shape, logits.dtype)]

    def compute(self, logits, labels, input_length, label_length):
        if np.issubdtype(labels.dtype, np.floating):
            labels = labels.astype(np.int64)
        loss, grad = kernels.ctc_loss(_writable(logits), _writable(labels),
                                      _writable(input_length).reshape(-1),
                                      _writable(label_length).reshape(-1))
        return loss.astype(logits.dtype, copy=False), grad.astype(logits.dtype, copy=False)

    def grad(self, inputs, outputs, grads):
        g = grads[0]
        if g is None:
            return [None] * 4
        return [reshape_static_dims(g, (1, 2), 3) * outputs[1], None, None, None]


class CTCDecode(Op):
    """Decoded label sequences (padded with -1) and their log-probabilities."""

    api = "ctc_decode"

    def __init__(self, greedy, beam_width, top_paths, merge_repeated=False):
        self.greedy = greedy
        self.beam_width = beam_width
        self.top_paths = top_paths
        self.merge_repeated = merge_repeated
        self.n_outputs = top_paths + 1

    def infer(self, logprobs, input_length):
        if logprobs.ndim != 3:
            raise ValueError("ctc_decode: y_pred must be (samples, time_steps, num_categories), "
                             "got shape %s" % (logprobs.shape,))
        b = logprobs.shape[0]
        return [((b, None), "int64")] * self.top_paths + [((b, self.top_paths), logprobs.dtype)]

    def compute(self, logprobs, input_length):
        logprobs = _writable(logprobs)
        input_length = _writable(input_length).reshape(-1)
        if self.greedy:
            decoded, log_prob = kernels.ctc_greedy_decode(logprobs, input_length)
            return decoded, log_prob
        decoded, log_prob = kernels.ctc_beam_decode(logprobs, input_length,
                                                    beam_width=self.beam_width,
                                                    top_paths=self.top_paths,
                                                    merge_repeated=self.merge_repeated)
        return tuple(decoded) + (log_prob,)


class DenseToSparse(Op):
    """Labels (B, L) and lengths (B,) to a sparse (B, L) matrix holding
    labels[b, :length[b]] (explicit entries, zeros included)."""

    api = "ctc_label_dense_to_sparse"
    # A sparse result cannot become a Constant: never fold this op.
    pure = False

    def infer(self, labels, lengths):
        return [(labels.shape, labels.dtype)]

    def compute(self, labels, lengths):
        import scipy.sparse as sp
        lengths = np.asarray(lengths).reshape(-1).astype(np.int64)
        nb, width = labels.shape
        if lengths.shape[0] != nb or np.any(lengths < 0) or np.any(lengths > width):
            raise ValueError("ctc_label_dense_to_sparse: label_lengths %s do not fit labels of "
                             "shape %s" % (lengths.tolist(), labels.shape))
        rows = np.repeat(np.arange(nb), lengths)
        cols = np.concatenate([np.arange(n) for n in lengths]) if nb else np.zeros(0, np.int64)
        return (sp.coo_matrix((labels[rows, cols], (rows, cols)), shape=labels.shape),)
