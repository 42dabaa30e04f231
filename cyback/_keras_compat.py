"""Shims that let multi-backend Keras 2.2.4, 2.2.5 and 2.3.1 run on Python 3.11,
NumPy 2 and h5py 3.

Those Keras releases predate all three. ``install()`` puts back exactly the
names they use that were since removed, and fixes their HDF5 string handling;
see docs/keras.md for the full story. Every item below names the Keras
file that needs it.

Names (restored only when missing, so an older Python/NumPy is left as is):

=========================  =================================================
``collections.Iterable``   callbacks.py (2.2.4, 2.2.5), callbacks/callbacks.py
                           (2.3.1): ``from collections import Iterable`` at
                           import time of ``keras.callbacks``.
``collections.Mapping``    engine/training_utils.py (2.3.1): losses, loss
                           weights and metrics given as dicts (compile).
``collections.Sequence``   engine/training_utils.py (2.3.1): losses as lists.
``collections.Container``  engine/training_utils.py (2.2.5, 2.3.1):
                           ``should_run_validation``, when fit gets
                           ``validation_freq`` as a list.
``inspect.getargspec``     preprocessing/image.py (2.2.4): ImageDataGenerator
                           and array_to_img/img_to_array wrappers.
``inspect.ArgSpec``        utils/generic_utils.py ``getargspec`` (2.2.5,
                           2.3.1), called by preprocessing/image.py (2.2.5).
``numpy.Inf``              callbacks: EarlyStopping, ModelCheckpoint,
                           ReduceLROnPlateau (all three versions).
``numpy.string_``          utils/io_utils.py ``H5Dict.__getitem__`` (all
                           three): used by ``load_model``.
``numpy.unicode_``         keras_preprocessing/sequence.py
                           ``pad_sequences`` (1.1.x, which all three
                           re-export as keras.preprocessing.sequence).
=========================  =================================================

h5py 3 reads variable-length string attributes as ``str`` (h5py 2 gave
``bytes``), and Keras ``.decode()``s them when loading. h5py 3 also *writes*
a Python ``bytes`` attribute as a variable-length string, so even Keras's own
files fail to load, as do files written by tf.keras. A hook on
``sys.meta_path`` patches, as soon as Keras imports them:

- ``keras.utils.io_utils.H5Dict.__getitem__`` (load_model): string
  attributes read from HDF5 are returned as h5py 2 returned them: ``bytes``
  for strings stored as ASCII (Python bytes), and for UTF-8 ones (Python
  str) a ``str`` that also has the ``decode`` Keras calls;
- ``keras.engine.saving.load_attributes_from_hdf5_group``,
  ``load_weights_from_hdf5_group`` and
  ``load_weights_from_hdf5_group_by_name`` (load_weights, load_model): they
  see the HDF5 group through a view whose ``attrs`` give strings the same way;
- ``keras.utils.io_utils.save_to_binary_h5py`` (``model.save(io.BytesIO())``)
  opened its in-memory file without a mode, which h5py 3 takes as read-only.

When Keras runs on cyback, ``keras.engine.network.Network`` also gets a
``__reduce__``: models pickle (pickle, cloudpickle) as an in-memory HDF5 save.

Other Keras bugs the hook works around (see the functions below): Lambda
output shapes (``_patch_core_layers``), NumPy integers in Flatten/Reshape
shapes (``_patch_shape_arithmetic``), TimeDistributed's undefined global
(``_patch_wrappers``), and keras.backend's session helpers.

Nothing outside those Keras functions sees a change: h5py itself is not
patched. ``install()`` is idempotent and cheap; cyback calls it on import,
which is early enough, because Keras imports the backend (from
``keras/utils/conv_utils.py``) before any module that needs a shim, and
patches modules already imported (``keras.utils.io_utils`` is) in place.
"""

import collections
import collections.abc
import importlib.abc
import inspect
import io
import os
import sys

import numpy as np

from cyback.graph import pickling as _graph_pickling

__all__ = ['install', 'installed']

_MARK = '__cyback_keras_compat__'


# -- removed names ----------------------------------------------------------

_ArgSpec = collections.namedtuple('ArgSpec', 'args varargs keywords defaults')


def _getargspec(func):
    """Stand-in for ``inspect.getargspec`` (removed in Python 3.11).

    Unlike the original it does not refuse functions that have keyword-only
    arguments or annotations; Keras only reads ``.args``.
    """
    spec = inspect.getfullargspec(func)
    return _ArgSpec(spec.args, spec.varargs, spec.varkw, spec.defaults)


def _missing_names():
    """(module, name, value) for every removed name Keras needs."""
    return [
        (collections, 'Iterable', collections.abc.Iterable),
        (collections, 'Mapping', collections.abc.Mapping),
        (collections, 'Sequence', collections.abc.Sequence),
        (collections, 'Container', collections.abc.Container),
        (inspect, 'getargspec', _getargspec),
        (inspect, 'ArgSpec', _ArgSpec),
        (np, 'Inf', np.inf),
        (np, 'string_', np.bytes_),
        (np, 'unicode_', np.str_),
    ]


def _has_name(module, name):
    # NumPy 2 answers removed aliases from a module __getattr__ that raises
    # AttributeError, so hasattr is the right test for both kinds of module.
    try:
        getattr(module, name)
    except AttributeError:
        return False
    return True


def _restore_names():
    for module, name, value in _missing_names():
        if not _has_name(module, name):
            setattr(module, name, value)


# -- h5py 3 strings -----------------------------------------------------------

class _DecodableStr(str):
    """A string that h5py 3 read from a UTF-8 attribute. Keras 2.x calls
    ``.decode()`` on what h5py 2 returned as bytes; this str still compares
    equal to the str that was written and decodes to itself."""

    __slots__ = ()

    def decode(self, encoding='utf-8', errors='strict'):
        return str(self)


def _attr_encoding(attrs, name):
    """'ascii' or 'utf-8' for a string attribute, else None."""
    h5py = _h5py()
    try:
        info = h5py.check_string_dtype(attrs.get_id(name).dtype)
    except Exception:
        return None
    return info.encoding if info is not None else None


def _as_bytes(value, encoding=None):
    """The str that h5py 3 gives for string attributes, as h5py 2 gave it.

    h5py stores Python bytes as ASCII strings and str as UTF-8 ones: ASCII
    strings come back as bytes, UTF-8 ones as a str that has ``decode``.
    Without a known encoding, strings become bytes (what Keras decodes).
    """
    if encoding == 'utf-8':
        def convert(item):
            return _DecodableStr(item) if isinstance(item, str) else item
    else:
        def convert(item):
            return item.encode('utf8') if isinstance(item, str) else item
    if isinstance(value, str):
        return convert(value)
    if isinstance(value, np.ndarray):
        if value.dtype.kind == 'U':
            value = value.astype(object)
        if value.dtype == object:
            out = np.empty(value.shape, dtype=object)
            flat_in, flat_out = value.reshape(-1), out.reshape(-1)
            for i in range(flat_in.size):
                flat_out[i] = convert(flat_in[i])
            return out
        return value
    if isinstance(value, list):
        return [convert(v) for v in value]
    return value


class _BytesAttrs(object):
    """Read view of an h5py AttributeManager that gives bytes for strings."""

    __slots__ = ('_attrs',)

    def __init__(self, attrs):
        self._attrs = attrs

    def __getitem__(self, name):
        return _as_bytes(self._attrs[name], _attr_encoding(self._attrs, name))

    def get(self, name, default=None):
        if name in self._attrs:
            return self[name]
        return default

    def __contains__(self, name):
        return name in self._attrs

    def __iter__(self):
        return iter(self._attrs)

    def __len__(self):
        return len(self._attrs)

    def keys(self):
        return self._attrs.keys()

    def __getattr__(self, name):
        return getattr(self._attrs, name)


class _BytesAttrsGroup(object):
    """An h5py Group/File seen by old Keras: same items, attrs as bytes."""

    __slots__ = ('_group',)

    def __init__(self, group):
        self._group = group

    @property
    def attrs(self):
        return _BytesAttrs(self._group.attrs)

    def __getitem__(self, name):
        return self._group[name]

    def __contains__(self, name):
        return name in self._group

    def __iter__(self):
        return iter(self._group)

    def __len__(self):
        return len(self._group)

    def keys(self):
        return self._group.keys()

    def __getattr__(self, name):
        return getattr(self._group, name)


def _h5py():
    return sys.modules.get('h5py')


def _wrap_group_arg(func):
    """Make ``func(group, ...)`` see ``group`` through _BytesAttrsGroup."""
    if getattr(func, _MARK, False):
        return func

    def wrapper(group, *args, **kwargs):
        h5py = _h5py()
        if (h5py is not None and isinstance(group, h5py.Group)):
            group = _BytesAttrsGroup(group)
        return func(group, *args, **kwargs)

    wrapper.__name__ = func.__name__
    wrapper.__qualname__ = getattr(func, '__qualname__', func.__name__)
    wrapper.__doc__ = func.__doc__
    wrapper.__module__ = func.__module__
    wrapper.__wrapped__ = func
    setattr(wrapper, _MARK, True)
    return wrapper


def _patch_saving(module):
    """keras/engine/saving.py (2.2.4, 2.2.5, 2.3.1)."""
    if callable(getattr(module, 'save_to_binary_h5py', None)):
        module.save_to_binary_h5py = _save_to_binary_h5py
    for name in ('load_attributes_from_hdf5_group',
                 'load_weights_from_hdf5_group',
                 'load_weights_from_hdf5_group_by_name'):
        func = getattr(module, name, None)
        if callable(func):
            setattr(module, name, _wrap_group_arg(func))


def _save_to_binary_h5py(save_function, stream):
    """``save_function`` writes into an HDF5 file held in memory, whose bytes
    then go to ``stream``."""
    import h5py
    # h5py 3 opens read-only unless told otherwise (h5py 2 defaulted to 'a').
    with h5py.File('cyback-in-memory.h5', mode='w', driver='core',
                   backing_store=False) as h5file:
        result = save_function(h5file)
        h5file.flush()
        image = h5file.id.get_file_image()
    stream.write(image)
    return result


setattr(_save_to_binary_h5py, _MARK, True)


def _patch_io_utils(module):
    """keras/utils/io_utils.py H5Dict (2.2.4, 2.2.5, 2.3.1) and
    save_to_binary_h5py (2.3.1: ``model.save(io.BytesIO())``), which opened its
    in-memory file with h5py 2's default mode."""
    if callable(getattr(module, 'save_to_binary_h5py', None)):
        module.save_to_binary_h5py = _save_to_binary_h5py
    h5dict = getattr(module, 'H5Dict', None)
    if h5dict is None:
        return
    getitem = h5dict.__dict__.get('__getitem__')
    if getitem is None or getattr(getitem, _MARK, False):
        return

    def __getitem__(self, attr):
        h5py = _h5py()
        data = self.data
        if h5py is None or not isinstance(data, h5py.Group):
            return getitem(self, attr)
        if (attr not in data.attrs and attr not in data
                and ('%s0' % attr) in data.attrs):
            # A list attribute split over '<attr>0', '<attr>1', ... because
            # it exceeded the HDF5 header limit. Return bytes like the
            # unsplit case, which is what the callers decode.
            values, chunk = [], 0
            while ('%s%d' % (attr, chunk)) in data.attrs:
                name = '%s%d' % (attr, chunk)
                part = _as_bytes(data.attrs[name], _attr_encoding(data.attrs, name))
                values.extend(part.tolist() if isinstance(part, np.ndarray)
                              else part)
                chunk += 1
            return values
        value = getitem(self, attr)
        encoding = _attr_encoding(data.attrs, attr) if attr in data.attrs else None
        if isinstance(value, np.ndarray) and value.size == 0:
            # An empty list attribute (a layer without weights): NumPy 2
            # refuses the truth value of an empty array, which 2.2.4 tests.
            return []
        if isinstance(value, np.ndarray) and value.dtype.kind in 'OU' and \
                all(isinstance(v, (str, bytes)) for v in value.reshape(-1)):
            # h5py 2 gave string arrays as dtype S, which H5Dict turned into
            # a list of bytes; Keras 2.2.4 tests `if weight_names:` on it.
            return _as_bytes(value, encoding).tolist()
        return _as_bytes(value, encoding)

    __getitem__.__doc__ = getitem.__doc__
    __getitem__.__wrapped__ = getitem
    setattr(__getitem__, _MARK, True)
    h5dict.__getitem__ = __getitem__


def _patch_core_layers(module):
    """keras/layers/core.py Lambda (2.2.4, 2.2.5, 2.3.1): infer the output shape.

    Without ``output_shape``, Lambda calls its function on placeholders to
    learn the output shape only for TensorFlow and CNTK; for any other backend
    it warns and assumes the input shape, so a Lambda that changes the shape
    (a mean over an axis, a reshape) builds the next layer's weights wrong.
    cyback's static shapes answer the same question the same way.
    """
    lam = getattr(module, 'Lambda', None)
    original = getattr(lam, '__dict__', {}).get('compute_output_shape')
    if original is None or getattr(original, _MARK, False):
        return

    def compute_output_shape(self, input_shape):
        if self._output_shape is not None or not _cyback_is_backend():
            return original(self, input_shape)
        from cyback.api import core as cyback
        dtypes = getattr(self, '_input_dtypes', None)
        if isinstance(input_shape, list):
            if not isinstance(dtypes, list):
                dtypes = [dtypes] * len(input_shape)
            x = self.call([cyback.placeholder(shape=s, dtype=d)
                           for s, d in zip(input_shape, dtypes)])
        else:
            x = self.call(cyback.placeholder(
                shape=input_shape, dtype=None if isinstance(dtypes, list) else dtypes))
        if isinstance(x, list):
            return [cyback.int_shape(t) for t in x]
        return cyback.int_shape(x)

    compute_output_shape.__doc__ = original.__doc__
    compute_output_shape.__wrapped__ = original
    setattr(compute_output_shape, _MARK, True)
    lam.compute_output_shape = compute_output_shape


def _python_int_shape(method):
    """Wrap a ``compute_output_shape`` so NumPy integers in the shape become ints."""
    if getattr(method, _MARK, False):
        return method

    def compute_output_shape(self, input_shape):
        shape = method(self, input_shape)
        if isinstance(shape, tuple):
            shape = tuple(int(d) if isinstance(d, np.integer) else d for d in shape)
        return shape

    compute_output_shape.__doc__ = method.__doc__
    compute_output_shape.__wrapped__ = method
    setattr(compute_output_shape, _MARK, True)
    return compute_output_shape


def _patch_shape_arithmetic(module):
    """keras/layers/core.py Flatten and Reshape (2.2.4, 2.2.5, 2.3.1) compute
    sizes with ``np.prod``, so their output shapes hold NumPy integers, which
    NumPy 2 prints as ``np.int64(512)``: model.summary() showed
    ``(None, np.int64(512))``, and the shape reached configs and error messages
    that way. Shapes become plain ints, as on NumPy 1 they printed."""
    for name in ('Flatten', 'Reshape'):
        layer = getattr(module, name, None)
        method = getattr(layer, '__dict__', {}).get('compute_output_shape')
        if method is not None:
            layer.compute_output_shape = _python_int_shape(method)


def _cyback_is_backend():
    # 2.3.1 keeps the name in keras/backend/load_backend.py, 2.2.x in
    # keras/backend/__init__.py.
    for name in ('keras.backend.load_backend', 'keras.backend'):
        if getattr(sys.modules.get(name), '_BACKEND', None) == 'cyback':
            return True
    return False


def _patch_network_pickling(module):
    """keras/engine/network.py Network (2.2.4, 2.2.5, 2.3.1): pickle models on cyback.

    2.2.x cannot pickle a model at all, and 2.3.1's ``__getstate__`` needs
    Keras already imported on the right backend where it is unpickled. On
    cyback a model pickles as the bytes of an in-memory HDF5 save, loaded by
    cyback (which selects itself as Keras's backend when Keras is not yet
    imported): see "pickling Keras models" below.
    """
    network = getattr(module, 'Network', None)
    if network is None or not _cyback_is_backend() or \
            getattr(network.__dict__.get('__reduce__'), _MARK, False):
        return

    def __reduce__(self):
        return reduce_keras_model(self)

    setattr(__reduce__, _MARK, True)
    network.__reduce__ = __reduce__


#: Session helpers that keras/backend/__init__.py re-exports only for the
#: TensorFlow and CNTK backends; user code calls keras.backend.clear_session().
_SESSION_NAMES = ('clear_session', 'manual_variable_initialization', 'get_session',
                  'set_session')


def _patch_backend_namespace(_module=None):
    """Give ``keras.backend`` cyback's session helpers when cyback is the backend.

    keras.backend is still executing when it imports cyback, so this runs
    when Keras imports its next modules (activations, engine, layers).
    """
    kb = sys.modules.get('keras.backend')
    if kb is None or not _cyback_is_backend():
        return
    cyback = sys.modules.get('cyback')
    for name in _SESSION_NAMES:
        if not hasattr(kb, name) and hasattr(cyback, name):
            setattr(kb, name, getattr(cyback, name))


def _patch_wrappers(module):
    """keras/layers/wrappers.py TimeDistributed (2.2.5, 2.3.1): with a fixed batch
    size, ``call`` runs the wrapped layer in a ``K.rnn`` step that declares
    ``global uses_learning_phase`` and reads it, but the module never defines
    that global. On TensorFlow the read is skipped (its tensors carry no
    ``_uses_learning_phase``); every cyback tensor does, so the step raised
    NameError. The global only needs to exist: ``K.rnn`` itself marks its
    outputs when the step uses the learning phase."""
    if not hasattr(module, 'uses_learning_phase'):
        module.uses_learning_phase = False


def _patch_core_layers_all(module):
    _patch_core_layers(module)
    _patch_shape_arithmetic(module)


_POST_IMPORT = {
    'keras.engine.saving': _patch_saving,
    'keras.utils.io_utils': _patch_io_utils,
    'keras.activations': _patch_backend_namespace,
    'keras.engine': _patch_backend_namespace,
    'keras.layers': _patch_backend_namespace,
    'keras.layers.core': _patch_core_layers_all,
    'keras.layers.wrappers': _patch_wrappers,
    'keras.engine.network': _patch_network_pickling,
}


class _PatchingLoader(object):
    """Delegates to the real loader, then patches the executed module."""

    def __init__(self, loader, patch):
        self._loader = loader
        self._patch = patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _KerasPostImportHook(importlib.abc.MetaPathFinder):
    """Patches the Keras modules in _POST_IMPORT right after they execute."""

    def find_spec(self, fullname, path, target=None):
        patch = _POST_IMPORT.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _KerasPostImportHook):
                continue
            find_spec = getattr(finder, 'find_spec', None)
            if find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, 'exec_module'):
            return spec
        spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


setattr(_KerasPostImportHook, _MARK, True)


def _install_hook():
    for finder in sys.meta_path:
        if getattr(type(finder), _MARK, False):
            return
    sys.meta_path.insert(0, _KerasPostImportHook())
    # Modules Keras imported before its backend (io_utils is one) are
    # patched in place.
    for name, patch in _POST_IMPORT.items():
        module = sys.modules.get(name)
        if module is not None:
            patch(module)


_installed = False


def install():
    """Restore what Keras 2.2.x/2.3.1 need on Python 3.11+/NumPy 2/h5py 3.

    Idempotent: later calls do nothing.
    """
    global _installed
    if _installed:
        return
    _restore_names()
    _install_hook()
    _installed = True


def installed():
    """True once install() has run in this interpreter."""
    return _installed


# -- the backend settings Keras keeps a copy of -----------------------------
#
# keras.backend.common holds Keras's own floatx, epsilon and
# image_data_format, read from keras.json before Keras imports its backend.
# cyback.config keeps them in step with its own through the holder
# registered here (config itself knows no Keras). Keras rejects a bad floatx
# or data format in keras.json itself but takes any float as epsilon, which
# is why config gives the holder its own epsilon when Keras's fails the check.

def _keras_backend_common():
    # Only when Keras itself is loading or has loaded us; never import Keras.
    return sys.modules.get("keras.backend.common")


def share_backend_settings():
    """Register Keras's copy of floatx/epsilon/image_data_format with
    cyback.config (``config.register_settings_mirror``)."""
    from cyback import config
    config.register_settings_mirror(_keras_backend_common)


# -- pickling Keras models --------------------------------------------------
#
# On cyback a Keras model pickles (pickle, cloudpickle) as the bytes of an
# in-memory HDF5 save (Network.__reduce__, installed by
# _patch_network_pickling), so a pickle holds no Keras internals and loads with
# any supported Keras. The graph layer pickles tensors and functions and knows
# no Keras; pickles made when this code lived there name
# cyback.graph.pickling._load_pickled_keras_model, registered there below.

def keras_model_bytes(model, include_optimizer=True):
    """The model saved as HDF5 (architecture, weights and, when compiled and
    asked for, the optimizer state), in memory."""
    import h5py
    from keras.models import save_model
    buf = io.BytesIO()
    with h5py.File(buf, 'w') as f:
        save_model(model, f, include_optimizer=include_optimizer and
                   getattr(model, 'optimizer', None) is not None)
    return buf.getvalue()


def _use_cyback_keras():
    """Import Keras on cyback (selecting it if Keras is not imported yet)."""
    if 'keras' not in sys.modules:
        os.environ.setdefault('KERAS_BACKEND', 'cyback')
    import keras
    if keras.backend.backend() != 'cyback':
        raise RuntimeError(
            'cannot load a Keras model pickled on cyback: Keras in this process runs on '
            'backend %r; set KERAS_BACKEND=cyback before Keras is imported'
            % keras.backend.backend())
    return keras


def load_keras_model(data, custom_objects=None, compile=True):
    """A Keras model from ``keras_model_bytes`` output (compiled as it was
    saved when ``compile``; a model saved uncompiled stays so, silently)."""
    import h5py
    keras = _use_cyback_keras()
    with h5py.File(io.BytesIO(data), 'r') as f:
        compile = compile and 'training_config' in f.attrs
        return keras.models.load_model(f, custom_objects=custom_objects, compile=compile)


def custom_objects_of(model):
    """Layer classes of ``model`` that Keras does not define, by name, so that
    the receiving side can deserialize them (cloudpickle ships classes
    defined in ``__main__`` by value; others must be importable there)."""
    found = {}
    stack = list(getattr(model, 'layers', []))
    while stack:
        layer = stack.pop()
        cls = type(layer)
        if not cls.__module__.startswith('keras.'):
            found[cls.__name__] = cls
        stack.extend(getattr(layer, 'layers', []))
    return found


def _load_pickled_keras_model(data, custom_objects):
    return load_keras_model(data, custom_objects or None, compile=True)


def reduce_keras_model(model):
    """``__reduce__`` of a Keras Network on cyback."""
    return _load_pickled_keras_model, (keras_model_bytes(model), custom_objects_of(model))


_graph_pickling.register_moved('_load_pickled_keras_model', _load_pickled_keras_model)
