"""The model: what travels to the workers (``_Model``: its bytes, how to load
them, a digest of them), how a loaded model runs a task's rows
(``_Runner``), and how ``predict`` turns what it is given (a Keras model, an
``.h5`` path, a ``K.function``) into both, remembering what it saved or
read."""
import collections
import os
import weakref

import numpy as np

from cyback.dask.common import _API

#: models a worker keeps loaded (cyback/dask/model_cache.py), and model files
#: predict remembers having read
_CACHE_SIZE = 4


class _Model(object):
    """What travels to the workers: the model's bytes, how to load them, and a
    digest of them (the cache key)."""

    __slots__ = ("kind", "data", "custom_objects", "token")

    def __init__(self, kind, data, custom_objects=None):
        from cyback.graph.pickling import token
        self.kind = kind                # "keras" (HDF5 bytes) or "function" (a pickle)
        self.data = data
        self.custom_objects = custom_objects or {}
        self.token = token(data)

    def __getstate__(self):
        return self.kind, self.data, self.custom_objects, self.token

    def __dask_tokenize__(self):
        return ("cyback-model", self.token)

    def __setstate__(self, state):
        self.kind, self.data, self.custom_objects, self.token = state

    def load(self):
        if self.kind == "keras":
            from cyback._keras_compat import load_keras_model
            return _Runner(load_keras_model(self.data, self.custom_objects or None,
                                            compile=False))
        import cloudpickle
        return _Runner(cloudpickle.loads(self.data))


class _Runner(object):
    """A loaded model, run batch by batch through its compiled function.

    Keras models are run through their predict function directly, not
    ``model.predict``: batches are views of the chunk (Keras' loop copies each
    one through a fancy index) and land in preallocated outputs."""

    def __init__(self, model):
        from cyback import config
        from cyback.graph.function import Function
        self.model = model
        self.is_function = isinstance(model, Function)
        if self.is_function:
            fn = model
        else:
            # Built here, once, not by the first of several threads at once.
            model._make_predict_function()
            fn = model.predict_function
        lp = config.learning_phase_placeholder()
        self.fn = fn
        self.outputs = list(fn.outputs)
        self.feeds = [x for x in fn.inputs if x is not lp]
        self.lp_index = next((i for i, x in enumerate(fn.inputs) if x is lp), None)
        self.input_shape = tuple(self.feeds[0].shape) if len(self.feeds) == 1 else None
        self.input_dtype = self.feeds[0].dtype if self.feeds else None

    def check(self, what):
        if len(self.feeds) != 1:
            raise ValueError("%s: the %s has %d inputs; predict takes models of one input"
                             % (_API, what, len(self.feeds)))
        scalars = [i for i, o in enumerate(self.outputs) if len(o.shape) == 0]
        if scalars:
            raise ValueError("%s: output %d of the %s is a scalar; predict needs one row of "
                             "output per row of input" % (_API, scalars[0], what))
        if self.is_function and self.model._updates:
            raise ValueError("%s: the function has updates, which would change its variables "
                             "on each worker apart; compile one without updates" % _API)

    def run_batch(self, batch):
        """One array per output for one batch (in the test phase)."""
        feeds = [batch]
        if self.lp_index is not None:
            feeds.insert(self.lp_index, np.zeros((), bool))
        out = self.fn(feeds)
        return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]

    def predict(self, blocks, batch_size, out_specs, where):
        """The rows of ``blocks`` (arrays, in order) predicted in batches of
        ``batch_size``, one array per output of ``out_specs``' shapes."""
        total = sum(len(b) for b in blocks)
        outs = [np.empty((total,) + tuple(tail), dtype) for tail, dtype in out_specs]
        done = 0
        for batch in _batches(blocks, batch_size):
            n = len(batch)
            for i, (out, got) in enumerate(zip(outs, self.run_batch(batch))):
                if got.shape[:1] != (n,):
                    raise ValueError("%s: for %s the model's output %d has %d rows for a batch "
                                     "of %d, not one per input row"
                                     % (_API, where, i, len(got) if got.ndim else 0, n))
                if got.shape[1:] != out.shape[1:]:
                    raise ValueError("%s: for %s the model's output %d has samples of shape "
                                     "%s, not %s as on the first row"
                                     % (_API, where, i, got.shape[1:], out.shape[1:]))
                out[done:done + n] = got
            done += n
        return outs


def _batches(blocks, batch_size):
    """Batches of ``batch_size`` rows across ``blocks``: views of a block where
    a batch lies within one, joined only where a batch spans two."""
    pending, missing = [], batch_size
    for block in blocks:
        start = 0
        while start < len(block):
            if not pending and len(block) - start >= batch_size:
                yield block[start:start + batch_size]
                start += batch_size
                continue
            take = min(missing, len(block) - start)
            pending.append(block[start:start + take])
            start += take
            missing -= take
            if not missing:
                yield np.concatenate(pending)
                pending, missing = [], batch_size
    if pending:
        yield pending[0] if len(pending) == 1 else np.concatenate(pending)



#: what predict shipped for a Keras model object, with the fingerprint it
#: was saved at, and for a model file, by (path, modification time, size):
#: saving a model to HDF5 takes longer than the rest of building a job
_saved_models = weakref.WeakKeyDictionary()
_read_files = collections.OrderedDict()


def _fingerprint(model):
    """A digest of a Keras model's layers, configuration and weights."""
    import hashlib
    h = hashlib.sha1(repr([id(layer) for layer in model.layers]).encode())
    h.update(repr(model.get_config()).encode())
    for w in model.get_weights():
        h.update(np.ascontiguousarray(w).data)
    return h.hexdigest()


def _model_source(model):
    """(a _Model to ship, a runner loaded here to read shapes from)."""
    from cyback.graph.function import Function
    if isinstance(model, Function):
        import cloudpickle
        return _Model("function", cloudpickle.dumps(model)), _Runner(model), "function"
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        try:
            with open(path, "rb") as f:
                stat = os.fstat(f.fileno())
                key = (os.path.abspath(path), stat.st_mtime_ns, stat.st_size)
                found = _read_files.get(key)
                if found is not None:
                    return found
                data = f.read()
        except OSError as e:
            raise ValueError("%s: cannot read the model file %r: %s" % (_API, path, e)) from None
        from cyback._keras_compat import load_keras_model
        try:
            local = load_keras_model(data, compile=False)
        except (OSError, ValueError, KeyError) as e:
            raise ValueError("%s: %r is not a Keras HDF5 model file: %s"
                             % (_API, path, e)) from None
        _read_files[key] = found = _Model("keras", data), _Runner(local), "model in %s" % path
        while len(_read_files) > _CACHE_SIZE:
            _read_files.popitem(last=False)
        return found
    if hasattr(model, "predict") and hasattr(model, "outputs") and hasattr(model, "layers"):
        from cyback._keras_compat import custom_objects_of, keras_model_bytes
        fingerprint = _fingerprint(model)
        try:
            saved = _saved_models.get(model)
        except TypeError:       # not weakly referenceable: save it each time
            saved = None
        if saved is None or saved[0] != fingerprint:
            data = keras_model_bytes(model, include_optimizer=False)
            saved = fingerprint, _Model("keras", data, custom_objects_of(model))
            try:
                _saved_models[model] = saved
            except TypeError:
                pass
        return saved[1], _Runner(model), "model"
    raise TypeError("%s: model must be a Keras model on cyback, the path of a Keras .h5 file "
                    "or a cyback function (K.function), got %r" % (_API, type(model).__name__))

