"""CTC: loss with gradient, decoding, and label conversion."""
from cyback import config
from cyback.api._args import integer
from cyback.graph import calls as _calls
from cyback.graph.tensor import as_tensor, is_float_dtype, is_int_dtype
from cyback.ops import elementwise as ew
from cyback.ops import shape as shp
from cyback.ops.ctc import CTCDecode, CTCLoss, DenseToSparse

__all__ = ["ctc_batch_cost", "ctc_decode", "ctc_label_dense_to_sparse"]


def _lengths(api, name, x):
    x = as_tensor(x)
    if x.ndim == 2 and x.shape[1] in (1, None):
        x = shp.reshape(x, (-1,))
    if x.ndim != 1:
        raise ValueError("%s: %s must have shape (samples,) or (samples, 1), got %s"
                         % (api, name, x.shape))
    if not is_int_dtype(x.dtype):
        x = ew.cast(x, "int32")
    return x


def _log_probs(y_pred):
    """Keras feeds log(softmax + epsilon) to the CTC code as scores."""
    y_pred = as_tensor(y_pred)
    if not is_float_dtype(y_pred.dtype):
        raise TypeError("ctc: y_pred must be a float tensor of softmax outputs, got %s"
                        % y_pred.dtype)
    return ew.log(y_pred + config.epsilon())


def ctc_batch_cost(y_true, y_pred, input_length, label_length):
    """Per-sample CTC loss, shape (samples, 1). The blank is the last class."""
    api = "ctc_batch_cost"
    labels = as_tensor(y_true)
    loss, _ = CTCLoss()(_log_probs(y_pred), labels, _lengths(api, "input_length", input_length),
                        _lengths(api, "label_length", label_length))
    return shp.reshape_static_dims(loss, (1,), 2)


def ctc_decode(y_pred, input_length, greedy=True, beam_width=100, top_paths=1,
               merge_repeated=False):
    """Decode softmax outputs: ``([decoded (samples, max_len), ...], log_prob)``;
    decoded sequences are padded with -1. ``merge_repeated`` (beam search only,
    as in Keras 2.3.1) collapses equal neighbours in the returned paths."""
    api = "ctc_decode"
    beam_width = integer(api, "beam_width", beam_width, 1)
    top_paths = integer(api, "top_paths", top_paths, 1)
    if greedy:
        top_paths = 1
    if not greedy and top_paths > beam_width:
        raise ValueError("ctc_decode: top_paths (%d) cannot exceed beam_width (%d)"
                         % (top_paths, beam_width))
    op = CTCDecode(bool(greedy), beam_width, top_paths, bool(merge_repeated) and not greedy)
    outs = op(_log_probs(y_pred), _lengths(api, "input_length", input_length))
    return list(outs[:-1]), outs[-1]


def ctc_label_dense_to_sparse(labels, label_lengths):
    """A sparse (samples, max_len) tensor of the first label_lengths[b] labels of each row."""
    api = "ctc_label_dense_to_sparse"
    labels = as_tensor(labels)
    if labels.ndim != 2:
        raise ValueError("%s: labels must be 2-D (samples, max_len), got %s" % (api, labels.shape))
    out = DenseToSparse()(labels, _lengths(api, "label_lengths", label_lengths))
    out.sparse = True
    return out


# errors escaping each function name it; nodes remember it (graph/calls.py)
_calls.name_functions(globals(), __all__)
