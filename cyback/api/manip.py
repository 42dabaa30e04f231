"""Shape manipulation and indexing functions of the Keras backend API.

Thin: each function checks and normalises its arguments (axes, paddings,
factors, data_format) and builds ops from ``cyback.ops.shape`` and
``cyback.ops.manip``. Sizes and counts may be symbolic scalars where Keras
code passes them (``K.tile(x, [K.shape(y)[0], 1])``).
"""
import numbers

import numpy as np

from cyback import config
from cyback.api._args import integer
from cyback.api.core import to_dense
from cyback.graph import calls as _calls
from cyback.graph import limits
from cyback.graph.shapes import format_shape
from cyback.graph.tensor import (
    Constant,
    Tensor,
    as_tensor,
    dtype_name,
    is_float_dtype,
    is_int_dtype,
    register_list_stacker,
)
from cyback.kernels import settings as _settings
from cyback.ops import elementwise as ew
from cyback.ops import manip as mp
from cyback.ops import shape as shp
from cyback.ops.sparse import sparse_concatenate

__all__ = [
    "gather", "concatenate", "reshape", "permute_dimensions", "resize_images",
    "resize_volumes", "set_resize_half_pixel_centers", "resize_half_pixel_centers",
    "repeat_elements", "repeat", "arange", "tile", "flatten",
    "batch_flatten", "expand_dims", "squeeze", "temporal_padding", "spatial_2d_padding",
    "spatial_3d_padding", "stack", "one_hot", "reverse", "slice", "pattern_broadcast",
]



def _tensor(api, x, name="x"):
    if isinstance(x, Tensor):
        return x
    try:
        return as_tensor(x)
    except Exception:
        raise TypeError("%s: %s must be a tensor or array-like, got %r"
                        % (api, name, type(x).__name__)) from None


def _int(api, name, value, minimum=None):
    return integer(api, name, value, minimum)


def _axis(api, axis, ndim, name="axis", extra=0):
    """A non-negative axis in [0, ndim + extra); negative axes count from the end."""
    axis = _int(api, name, axis)
    n = ndim + extra
    if not -n <= axis < n:
        raise ValueError("%s: %s %d is out of range for a tensor of rank %d"
                         % (api, name, axis, ndim))
    return axis % n


def _rank(api, x, ndim):
    if x.ndim != ndim:
        raise ValueError("%s: expected a %d-D tensor, got shape %s"
                         % (api, ndim, format_shape(x.shape)))


def _pair(api, name, value):
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError("%s: %s must be a pair of ints (before, after), got %r"
                         % (api, name, value))
    return tuple(_int(api, name, v, 0) for v in value)


# ------------------------------------------------------------------ indexing

def gather(reference, indices):
    """``reference[indices]`` along the first axis; the result has shape
    ``indices.shape + reference.shape[1:]``."""
    reference = _tensor("gather", reference, "reference")
    indices = _tensor("gather", indices, "indices")
    if reference.ndim == 0:
        raise ValueError("gather: reference must have rank >= 1, got a scalar")
    if not is_int_dtype(indices.dtype):
        raise TypeError("gather: indices must be an integer tensor, got dtype %s"
                        % indices.dtype)
    n = reference.shape[0]
    if type(indices) is Constant and n is not None and indices.value.size:
        bad = indices.value[(indices.value >= n) | (indices.value < -n)]
        if bad.size:
            raise ValueError("gather: index %d is out of range for a reference of shape %s"
                             % (bad.ravel()[0], format_shape(reference.shape)))
    return mp.Gather()(reference, indices)


def slice(x, start, size):
    """``tf.slice``: ``x[start[i]:start[i] + size[i]]`` on every axis; a size
    of -1 takes the rest of the axis. `start`/`size` are lists of ints or
    scalar tensors, or 1-D int tensors."""
    x = _tensor("slice", x)
    start_s, start_t = shp.shape_arg("slice", start)
    size_s, size_t = shp.shape_arg("slice", size)
    if not len(start_s) == len(size_s) == x.ndim:
        raise ValueError("slice: start (%d entries) and size (%d entries) must both have "
                         "one entry per axis of x, shape %s"
                         % (len(start_s), len(size_s), format_shape(x.shape)))
    for b in start_s:
        if b is not None and b < 0:
            raise ValueError("slice: negative start %s" % format_shape(start_s))
    for s in size_s:
        if s is not None and s < -1:
            raise ValueError("slice: invalid size %s (use -1 for the rest of an axis)"
                             % format_shape(size_s))
    tensors = [t for t in (start_t, size_t) if t is not None]
    op = mp.Slice(start_s, size_s, (start_t is not None, size_t is not None))
    return op(x, *tensors)


# ------------------------------------------------------------------ reshaping

def concatenate(tensors, axis=-1):
    """Join tensors along ``axis``; dtypes are promoted to a common one."""
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError("concatenate: tensors must be a list of tensors, got %r"
                        % type(tensors).__name__)
    if not tensors:
        raise ValueError("concatenate: tensors is empty")
    tensors = [_tensor("concatenate", t, "tensors") for t in tensors]
    if all(getattr(t, "sparse", False) for t in tensors) and all(t.ndim == 2 for t in tensors):
        # Sparse stays sparse, as with TensorFlow's sparse_concat and Theano's
        # sparse stack; a mix with dense tensors is joined densely.
        return sparse_concatenate(tensors, _axis("concatenate", axis, 2))
    tensors = [_dense(t) for t in tensors]
    ndim = tensors[0].ndim
    if ndim == 0:
        raise ValueError("concatenate: cannot concatenate scalars; use stack")
    for t in tensors[1:]:
        if t.ndim != ndim:
            raise ValueError("concatenate: all tensors must have the same rank, got shapes %s"
                             % ", ".join(format_shape(t.shape) for t in tensors))
    axis = _axis("concatenate", axis, ndim)
    return shp.concatenate(tensors, axis)


def _dense(t):
    if getattr(t, "sparse", False):
        return to_dense(t)
    return t


def reshape(x, shape):
    """Reshape to ``shape``: ints (one may be -1), scalar tensors such as
    ``K.shape(x)[0]``, or a 1-D int tensor."""
    x = _tensor("reshape", x)
    return shp.reshape(x, shape)


def permute_dimensions(x, pattern):
    """Permute the axes: output axis i is input axis ``pattern[i]``."""
    x = _tensor("permute_dimensions", x)
    if not isinstance(pattern, (list, tuple, np.ndarray)):
        raise TypeError("permute_dimensions: pattern must be a tuple of axes, got %r"
                        % (pattern,))
    pattern = [_int("permute_dimensions", "pattern", p) for p in pattern]
    return shp.transpose(x, pattern)


def flatten(x):
    """All elements as a 1-D tensor."""
    x = _tensor("flatten", x)
    if x.ndim == 1:
        return x
    return shp.Reshape((-1,))(x)


def batch_flatten(x):
    """``(batch, d1, d2, ...)`` → ``(batch, d1 * d2 * ...)``."""
    x = _tensor("batch_flatten", x)
    if x.ndim == 0:
        raise ValueError("batch_flatten: expected a tensor of rank >= 1, got a scalar")
    return mp.BatchFlatten()(x)


def expand_dims(x, axis=-1):
    """Insert a size-1 axis at ``axis`` (-1: at the end)."""
    x = _tensor("expand_dims", x)
    axis = _axis("expand_dims", axis, x.ndim, extra=1)
    return shp.reshape_static_dims(x, (axis,), x.ndim + 1)


def squeeze(x, axis):
    """Remove the size-1 axis ``axis``."""
    x = _tensor("squeeze", x)
    if x.ndim == 0:
        raise ValueError("squeeze: cannot squeeze a scalar")
    axis = _axis("squeeze", axis, x.ndim)
    if x.shape[axis] is not None and x.shape[axis] != 1:
        raise ValueError("squeeze: axis %d of a tensor of shape %s has size %d, not 1"
                         % (axis, format_shape(x.shape), x.shape[axis]))
    return mp.Squeeze(axis)(x)


def stack(x, axis=0):
    """Stack rank-R tensors of one shape into a rank R+1 tensor along ``axis``."""
    if isinstance(x, Tensor) or not isinstance(x, (list, tuple)):
        raise TypeError("stack: x must be a list of tensors, got %r" % type(x).__name__)
    if not x:
        raise ValueError("stack: x is empty")
    tensors = [_tensor("stack", t) for t in x]
    ndim = tensors[0].ndim
    for t in tensors[1:]:
        if t.ndim != ndim or any(a is not None and b is not None and a != b
                                 for a, b in zip(t.shape, tensors[0].shape)):
            raise ValueError("stack: all tensors must have the same shape, got %s"
                             % ", ".join(format_shape(t.shape) for t in tensors))
    axis = _axis("stack", axis, ndim, extra=1)
    parts = [shp.reshape_static_dims(t, (axis,), ndim + 1) for t in tensors]
    return shp.concatenate(parts, axis)


register_list_stacker(stack)


def pattern_broadcast(x, broadcastable):
    """Theano's broadcast pattern: axes marked True must have size 1. Other
    backends broadcast every size-1 axis, so this is the identity with a check."""
    x = _tensor("pattern_broadcast", x)
    broadcastable = list(broadcastable)
    if len(broadcastable) != x.ndim:
        raise ValueError("pattern_broadcast: broadcastable has %d entries for a tensor of "
                         "shape %s" % (len(broadcastable), format_shape(x.shape)))
    axes = tuple(i for i, b in enumerate(broadcastable) if b)
    for a in axes:
        if x.shape[a] is not None and x.shape[a] != 1:
            raise ValueError("pattern_broadcast: axis %d is marked broadcastable but has size "
                             "%d in shape %s" % (a, x.shape[a], format_shape(x.shape)))
    unknown = tuple(a for a in axes if x.shape[a] is None)
    return mp.PatternBroadcast(unknown)(x) if unknown else x


# ------------------------------------------------------------------ repeating

def repeat_elements(x, rep, axis):
    """Repeat each entry ``rep`` times along ``axis``, like ``np.repeat``."""
    x = _tensor("repeat_elements", x)
    if x.ndim == 0:
        raise ValueError("repeat_elements: expected a tensor of rank >= 1, got a scalar")
    rep = _int("repeat_elements", "rep", rep, 0)
    axis = _axis("repeat_elements", axis, x.ndim)
    if rep == 1:
        return x
    out = mp.RepeatElements(rep, axis)(x)
    # Keras's backend tests read the static shape from here, as TF's and
    # Theano's repeat_elements set it.
    out._keras_shape = out.shape
    return out


def tile(x, n):
    """Tile ``x`` ``n[i]`` times along axis i. Like ``np.tile`` (and Theano), fewer
    counts than axes apply to the last axes (an int tiles the last axis).
    Counts may be symbolic scalars."""
    x = _tensor("tile", x)
    if isinstance(n, (numbers.Integral, np.integer)) or (isinstance(n, Tensor) and n.ndim == 0):
        n = [n]
    if isinstance(n, np.ndarray):
        n = n.tolist()
    if isinstance(n, (list, tuple)) and len(n) < x.ndim:
        n = [1] * (x.ndim - len(n)) + list(n)
    elif (isinstance(n, Tensor) and n.ndim == 1 and n.shape[0] is not None
          and n.shape[0] < x.ndim and is_int_dtype(n.dtype)):
        n = shp.concatenate([Constant(np.ones(x.ndim - n.shape[0], n.dtype)), n], 0)
    reps, reps_t = shp.shape_arg("tile", n)
    if len(reps) != x.ndim:
        raise ValueError("tile: n has %d entries but x has rank %d (shape %s); give at "
                         "most one count per axis" % (len(reps), x.ndim, format_shape(x.shape)))
    if any(r is not None and r < 0 for r in reps):
        raise ValueError("tile: negative count in n=%s" % format_shape(reps))
    if reps_t is None and all(r == 1 for r in reps):
        return x
    return mp.Tile(tuple(reps))(x, *([reps_t] if reps_t is not None else []))


def repeat(x, n):
    """``(samples, dim)`` → ``(samples, n, dim)``."""
    x = _tensor("repeat", x)
    _rank("repeat", x, 2)
    return tile(shp.reshape_static_dims(x, (1,), 3), [1, n, 1])


def arange(start, stop=None, step=1, dtype="int32"):
    """``[start, start + step, ...)`` below ``stop``; with one argument it is
    the stop (Theano's convention). Arguments may be scalar tensors."""
    dtype = dtype_name(dtype)
    if stop is None:
        start, stop = 0, start
    args = []
    for name, v in (("start", start), ("stop", stop), ("step", step)):
        if isinstance(v, Tensor):
            if v.ndim != 0:
                raise ValueError("arange: %s must be a scalar, got shape %s"
                                 % (name, format_shape(v.shape)))
            if type(v) is Constant:
                v = v.value.item()
        elif isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Real, np.number)):
            raise TypeError("arange: %s must be a number or a scalar tensor, got %r"
                            % (name, v))
        args.append(v)
    if not any(isinstance(v, Tensor) for v in args):
        n = mp.arange_length(*args)
        limits.check_shape("arange", (n,), dtype)
        if limits.foldable((n,), dtype):
            return Constant(mp.arange_values(args[0], args[1], args[2], dtype))
        # a long range is made when the function runs, not while building
        return mp.Arange(dtype)(*[Constant(np.asarray(v)) for v in args])
    if not isinstance(args[2], Tensor) and args[2] == 0:
        raise ValueError("arange: step must not be zero")
    return mp.Arange(dtype)(*[v if isinstance(v, Tensor) else as_tensor(v) for v in args])


# ------------------------------------------------------------------ resizing

def _factors(api, names, values):
    return [_int(api, n, v, 1) for n, v in zip(names, values)]


_resize = {"half_pixel_centers": _settings.get("CYBACK_RESIZE_HALF_PIXEL_CENTERS")}


def set_resize_half_pixel_centers(value):
    """Make bilinear ``resize_images`` sample at pixel centres, as TF 2's
    ``tf.image.resize`` (and so tf.keras's ``UpSampling2D(interpolation=
    'bilinear')``) does, instead of as TF 1's ``resize_bilinear``, which Keras
    2.3.1's TensorFlow backend calls. Off by default; for models trained with
    TF 2. Applies to graphs built afterwards (set it before building the
    model). The environment variable CYBACK_RESIZE_HALF_PIXEL_CENTERS=1 sets
    it at import."""
    if not isinstance(value, (bool, np.bool_)) and value not in (0, 1):
        raise TypeError("set_resize_half_pixel_centers: expected a bool, got %r" % (value,))
    _resize["half_pixel_centers"] = bool(value)


def resize_half_pixel_centers():
    """Whether bilinear ``resize_images`` uses TF 2's half-pixel centres."""
    return _resize["half_pixel_centers"]


def resize_images(x, height_factor, width_factor, data_format, interpolation="nearest"):
    """Upsample the rows and columns of a 4-D batch of images by integer
    factors: 'nearest' repeats pixels, 'bilinear' interpolates as TensorFlow's
    resize_bilinear (align_corners=False, half_pixel_centers=False), or with
    half-pixel centres as TF 2 after ``set_resize_half_pixel_centers(True)``."""
    api = "resize_images"
    x = _tensor(api, x)
    data_format = config.normalize_data_format(data_format)
    _rank(api, x, 4)
    fh, fw = _factors(api, ("height_factor", "width_factor"), (height_factor, width_factor))
    rows, cols = (2, 3) if data_format == "channels_first" else (1, 2)
    if interpolation == "nearest":
        for f, axis in ((fh, rows), (fw, cols)):
            if f != 1:
                x = mp.RepeatElements(f, axis)(x)
        return x
    if interpolation == "bilinear":
        if not is_float_dtype(x.dtype):
            x = ew.cast(x, config.floatx())
        # TensorFlow interpolates along the columns first, then the rows.
        half_pixel = _resize["half_pixel_centers"]
        for f, axis in ((fw, cols), (fh, rows)):
            if f != 1:
                x = mp.Interp1D(f, axis, half_pixel)(x)
        return x
    raise ValueError("resize_images: interpolation must be 'nearest' or 'bilinear', got %r"
                     % (interpolation,))


def resize_volumes(x, depth_factor, height_factor, width_factor, data_format):
    """Upsample the three spatial axes of a 5-D tensor by repeating entries."""
    api = "resize_volumes"
    x = _tensor(api, x)
    data_format = config.normalize_data_format(data_format)
    _rank(api, x, 5)
    factors = _factors(api, ("depth_factor", "height_factor", "width_factor"),
                       (depth_factor, height_factor, width_factor))
    axes = (2, 3, 4) if data_format == "channels_first" else (1, 2, 3)
    for f, axis in zip(factors, axes):
        if f != 1:
            x = mp.RepeatElements(f, axis)(x)
    return x


# ------------------------------------------------------------------ padding

def _pad(api, x, pads):
    if all(p == (0, 0) for p in pads):
        return x
    return mp.Pad(tuple(pads), api)(x)


def temporal_padding(x, padding=(1, 1)):
    """Zero-pad axis 1 of a 3-D tensor by ``padding = (before, after)``."""
    api = "temporal_padding"
    x = _tensor(api, x)
    _rank(api, x, 3)
    return _pad(api, x, [(0, 0), _pair(api, "padding", padding), (0, 0)])


def _spatial_padding(api, x, padding, data_format, n):
    x = _tensor(api, x)
    data_format = config.normalize_data_format(data_format)
    _rank(api, x, n + 2)
    if not isinstance(padding, (list, tuple)) or len(padding) != n:
        raise ValueError("%s: padding must be %d pairs of ints, got %r" % (api, n, padding))
    spatial = [_pair(api, "padding", p) for p in padding]
    if data_format == "channels_first":
        pads = [(0, 0), (0, 0)] + spatial
    else:
        pads = [(0, 0)] + spatial + [(0, 0)]
    return _pad(api, x, pads)


def spatial_2d_padding(x, padding=((1, 1), (1, 1)), data_format=None):
    """Zero-pad the two spatial axes of a 4-D tensor."""
    return _spatial_padding("spatial_2d_padding", x, padding, data_format, 2)


def spatial_3d_padding(x, padding=((1, 1), (1, 1), (1, 1)), data_format=None):
    """Zero-pad the three spatial axes of a 5-D tensor."""
    return _spatial_padding("spatial_3d_padding", x, padding, data_format, 3)


# ------------------------------------------------------------------ others

def one_hot(indices, num_classes):
    """float32 one-hot vectors of the integer ``indices`` on a new last axis;
    out-of-range indices give all-zero vectors (as ``tf.one_hot``)."""
    indices = _tensor("one_hot", indices, "indices")
    if not is_int_dtype(indices.dtype):
        raise TypeError("one_hot: indices must be an integer tensor, got dtype %s"
                        % indices.dtype)
    num_classes = _int("one_hot", "num_classes", num_classes, 0)
    return mp.OneHot(num_classes)(indices)


def reverse(x, axes):
    """Reverse ``x`` along an axis or a list of axes."""
    x = _tensor("reverse", x)
    if isinstance(axes, (numbers.Integral, np.integer)):
        axes = [axes]
    if not isinstance(axes, (list, tuple, np.ndarray)):
        raise TypeError("reverse: axes must be an int or a list of ints, got %r" % (axes,))
    axes = [_axis("reverse", a, x.ndim, "axes") for a in axes]
    if len(set(axes)) != len(axes):
        raise ValueError("reverse: repeated axis in %r" % (axes,))
    if not axes:
        return x
    return mp.Reverse(tuple(sorted(axes)))(x)


# errors escaping each function name it; nodes remember it (graph/calls.py)
_calls.name_functions(globals(), __all__)
