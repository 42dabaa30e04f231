"""cyback: a CPU backend for Keras.

The module itself is the backend namespace: ``import cyback as K`` gives the
Keras backend API, and ``KERAS_BACKEND=cyback`` makes multi-backend Keras load
it. See README.md.

The package is layered; a module imports only from its own layer and those
below it (``lint-imports`` checks this, contracts in pyproject.toml):

- ``python -m cyback``, ``cyback.demo``, ``cyback.bench``, ``cyback.dask``:
  programs and integrations built on the backend;
- ``cyback.saving``: ``load_model`` for files written by tf.keras 2.x, Keras 3
  and Keras 2.2/2.3 (config translation, weight mapping, safe mode);
  ``cyback.quantization`` beside it: post-training int8 quantization of Keras
  models (``quantize``, ``report``);
- ``cyback.layers``: the Keras layers and activations Keras 2.3.1 lacks
  (LayerNormalization, MultiHeadAttention, gelu, ...), written on the backend;
- ``cyback._keras_compat``: the patches multi-backend Keras needs;
- ``cyback.api``: the Keras backend functions (argument checks, Keras
  conventions), written with ops;
- ``cyback.ops``: the ops (shape rule, compute and gradient side by side),
  and what builds op graphs: ``gradients`` and the ``Scan`` loop;
- ``cyback.graph``: tensors, the ``Op`` interface, compiled functions and
  their planner, pickling; it knows no particular op;
- ``cyback.config``: floatx, epsilon, data format, threads, learning phase;
- ``cyback.kernels``: compiled kernels on NumPy arrays; they import nothing
  from cyback outside ``cyback.kernels``.

Where a lower layer needs something defined above it, the upper layer
registers it: ``graph.tensor.register_list_stacker`` (K.stack for lists of
tensors), ``graph.pickling.register_reducer`` (the loop ops),
``graph.pickling.register_moved`` (names older pickles hold),
``config.register_learning_phase_factory`` (the placeholder) and
``config.register_settings_mirror`` (Keras's copy of floatx, epsilon and the
data format). docs/layout.md says where each backend function's wrapper, op
and kernel live.
"""
from cyback._version import __version__  # noqa: F401

# What importing cyback changes in the process (OpenMP's environment, before
# any kernel loads libgomp; bad kernel settings; the allocator), all in one
# place: cyback/kernels/process.py lists each effect and how to opt out.
from cyback.kernels.process import apply_process_settings as _apply  # noqa: E402

_apply()
del _apply

from cyback import _keras_compat as _compat  # noqa: E402

_compat.install()
_compat.share_backend_settings()

from cyback.config import (  # noqa: E402,F401
    backend, epsilon, set_epsilon, floatx, set_floatx, cast_to_floatx, image_data_format,
    set_image_data_format, normalize_data_format, learning_phase, set_learning_phase,
    get_uid, reset_uids, name_scope, get_num_threads, set_num_threads,
)
from cyback.graph.tensor import Tensor, Variable, Placeholder  # noqa: E402,F401
from cyback.graph.optimize import set_graph_optimizer, graph_optimizer  # noqa: E402,F401
from cyback.ops import operators as _operators  # noqa: E402,F401
from cyback.api.core import *  # noqa: E402,F401,F403
from cyback.api.math import *  # noqa: E402,F401,F403
from cyback.api.manip import *  # noqa: E402,F401,F403
from cyback.api.nn import *  # noqa: E402,F401,F403
from cyback.api.random import *  # noqa: E402,F401,F403
from cyback.api.control import *  # noqa: E402,F401,F403
from cyback.api.conv import *  # noqa: E402,F401,F403
from cyback.api.rnn import *  # noqa: E402,F401,F403
from cyback.api.ctc import *  # noqa: E402,F401,F403

from cyback import config as _config  # noqa: E402


def load_model(filepath, custom_objects=None, compile=False, safe_mode=True):
    """Load a Keras model file as a Keras 2.3.1 model running on cyback.

    Reads what tf.keras / tf_keras 2.x (HDF5), Keras 3 (``.keras`` archives and
    legacy HDF5) and Keras 2.2/2.3 write; ``filepath`` may also be an open
    ``h5py.File`` or a binary file object. A model file is data: with
    ``safe_mode=True`` (the default) a file holding Python code (a ``Lambda``
    layer) is refused. Imports Keras with the cyback backend if it is not
    imported yet. See docs/model-files.md.
    """
    from cyback.saving import load_model as _load
    return _load(filepath, custom_objects=custom_objects, compile=compile,
                 safe_mode=safe_mode)


def quantize(model, calibration_data, *, per_channel=True, activations="uint8", skip=(),
             method="minmax", **options):
    """A Keras model computing ``model``'s outputs with its Dense, Conv1D and
    Conv2D layers in int8 (int32 sums), everything else in float32.

    ``calibration_data``: representative inputs (an array, a list of arrays
    or an iterable of batches) giving each quantized layer's input its scale
    and zero point by ``method`` (``"minmax"``, ``"percentile"``,
    ``"entropy"``). ``activations``: ``"uint8"`` (asymmetric) or ``"int8"``
    (symmetric); weights are symmetric, per output channel unless
    ``per_channel=False``. ``skip``: layer names to keep in float32.
    ``cyback.quantization.report`` measures each layer's error. Imports
    Keras with the cyback backend if it is not imported yet. See
    docs/int8.md.
    """
    from cyback.quantization import quantize as _quantize
    return _quantize(model, calibration_data, per_channel=per_channel, activations=activations,
                     skip=skip, method=method, **options)


_config._init_threads()
del _config
