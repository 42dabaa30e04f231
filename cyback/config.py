"""Settings shared by the whole backend: keras.json, floatx, epsilon, data format,
learning phase, uids, name scopes and threads.

Another holder of floatx/epsilon/image_data_format may be registered
(``register_settings_mirror``: the Keras compatibility layer registers
Keras's own copy); the getters here then read it and the setters write
both, so the two never disagree.

Importing this module changes nothing in the process: the import-time side
effects of ``import cyback`` are in cyback/kernels/process.py.
"""
import json
import os
import threading
from collections import defaultdict

import numpy as np

from cyback.kernels import cpu_budget as _cpu_budget
from cyback.kernels import process as _process
from cyback.kernels import settings as _registry
from cyback.kernels._checks import ConfigWarning  # noqa: F401  (re-exported)

_VALID_FLOATX = ("float16", "float32", "float64")
_VALID_FORMATS = ("channels_last", "channels_first")

_settings = {"floatx": "float32", "epsilon": 1e-7, "image_data_format": "channels_last"}
_sources = {k: "default" for k in _settings}


def keras_home():
    """The folder holding keras.json: ``$KERAS_HOME``, else ``~/.keras``."""
    if _registry.is_set("KERAS_HOME"):
        return _registry.raw("KERAS_HOME")
    base = os.path.expanduser("~")
    if not os.access(base, os.W_OK):
        base = "/tmp"
    return os.path.join(base, ".keras")



_DEFAULTS = dict(_settings)


def _load_keras_json():
    """Apply keras.json's floatx, epsilon and image_data_format.

    A bad file or value is a ConfigWarning naming the file, the key, the value
    and the value used instead (the default), not an error: keras.json is
    shared by every Keras program and backend on the machine, a broken one must
    not stop ``import cyback`` (nor ``import keras``, which imports cyback),
    and a warning still says exactly what to fix. No value is dropped silently.
    """
    path = os.path.join(keras_home(), "keras.json")
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return
    except (OSError, UnicodeDecodeError) as e:
        _config_warning("%s: cannot read it (%s); using the defaults %s"
                        % (path, e, _defaults_str()))
        return
    try:
        cfg = json.loads(text, parse_constant=_reject_constant)
    except ValueError as e:
        _config_warning("%s is not valid JSON (%s); using the defaults %s"
                        % (path, e, _defaults_str()))
        return
    if not isinstance(cfg, dict):
        _config_warning("%s must hold a JSON object, got %s; using the defaults %s"
                        % (path, type(cfg).__name__, _defaults_str()))
        return
    for key, check in (("floatx", _check_floatx), ("epsilon", _check_epsilon),
                       ("image_data_format", _check_format)):
        if key not in cfg:
            continue
        problem = check(cfg[key])
        if problem is None:
            _settings[key] = float(cfg[key]) if key == "epsilon" else cfg[key]
            _sources[key] = path
            continue
        _config_warning("%s: %r is %s, %s; using %r"
                        % (path, key, json.dumps(cfg[key]), problem, _DEFAULTS[key]))
        _settings[key] = _DEFAULTS[key]
        _sources[key] = "default"


def _reject_constant(name):
    # json accepts NaN, Infinity and -Infinity, which are not JSON; keep them
    # as floats so the epsilon check names them.
    return float(name.replace("Infinity", "inf"))


def _check_floatx(value):
    if value not in _VALID_FLOATX:
        return "expected one of %s" % ", ".join(repr(v) for v in _VALID_FLOATX)
    return None


def _check_epsilon(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not np.isfinite(value) or value < 0:
        return "expected a finite non-negative number"
    return None


def _check_format(value):
    if value not in _VALID_FORMATS:
        return "expected 'channels_last' or 'channels_first'"
    return None


def _defaults_str():
    return ", ".join("%s=%r" % kv for kv in _DEFAULTS.items())


def _config_warning(message):
    from cyback.kernels._checks import setting_warning
    setting_warning(message)


_load_keras_json()


# The registered holder: a function returning it, or None while there is none.
_mirror = {"find": lambda: None}


def register_settings_mirror(find):
    """Keep another holder of floatx, epsilon and image_data_format in step
    with this module: ``find()`` returns it (an object with any of
    ``floatx()``, ``set_floatx(v)``, ``epsilon()``, ...) or None when there is
    none at the moment. The getters read it, the setters write both. A
    holder whose epsilon fails keras.json's check (it read the same file
    without checking it) gets the epsilon in use here."""
    _mirror["find"] = find
    held = find()
    if held is not None and hasattr(held, "epsilon") and hasattr(held, "set_epsilon"):
        if _check_epsilon(held.epsilon()) is not None:
            held.set_epsilon(_settings["epsilon"])


def _shared():
    return _mirror["find"]()


def settings_sources():
    """Where each setting came from: 'default', a keras.json path, or 'set_*'."""
    return dict(_sources)


def floatx():
    """The default float type, as a string: 'float16', 'float32' or 'float64'."""
    held = _shared()
    if held is not None and hasattr(held, "floatx"):
        return held.floatx()
    return _settings["floatx"]


def set_floatx(floatx):
    """Set the default float type: 'float16', 'float32' or 'float64' (anything
    else raises ValueError). Tensors and variables made afterwards without a
    dtype take it."""
    floatx = str(floatx)
    if floatx not in _VALID_FLOATX:
        raise ValueError("set_floatx: unknown floatx type %r; expected one of %s"
                         % (floatx, ", ".join(_VALID_FLOATX)))
    _settings["floatx"] = floatx
    _sources["floatx"] = "set_floatx"
    held = _shared()
    if held is not None and hasattr(held, "set_floatx"):
        held.set_floatx(floatx)


def epsilon():
    """The fuzz factor used in numeric expressions."""
    held = _shared()
    if held is not None and hasattr(held, "epsilon"):
        return held.epsilon()
    return _settings["epsilon"]


def set_epsilon(e):
    """Set the fuzz factor of numeric expressions: a finite non-negative
    number (anything else raises ValueError)."""
    try:
        e = float(e)
    except (TypeError, ValueError):
        raise ValueError("set_epsilon: expected a number, got %r" % (e,)) from None
    if not np.isfinite(e) or e < 0:
        raise ValueError("set_epsilon: expected a finite non-negative number, got %r" % (e,))
    _settings["epsilon"] = e
    _sources["epsilon"] = "set_epsilon"
    held = _shared()
    if held is not None and hasattr(held, "set_epsilon"):
        held.set_epsilon(e)


def image_data_format():
    """'channels_last' or 'channels_first'."""
    held = _shared()
    if held is not None and hasattr(held, "image_data_format"):
        return held.image_data_format()
    return _settings["image_data_format"]


def set_image_data_format(data_format):
    """Set the default layout of image tensors: 'channels_last' (samples,
    rows, columns, channels) or 'channels_first' (samples, channels, rows,
    columns)."""
    if data_format not in _VALID_FORMATS:
        raise ValueError("set_image_data_format: unknown data_format %r; expected "
                         "'channels_last' or 'channels_first'" % (data_format,))
    _settings["image_data_format"] = data_format
    _sources["image_data_format"] = "set_image_data_format"
    held = _shared()
    if held is not None and hasattr(held, "set_image_data_format"):
        held.set_image_data_format(data_format)


def normalize_data_format(value):
    """None → image_data_format(); otherwise check and lower-case the value."""
    if value is None:
        value = image_data_format()
    fmt = str(value).lower()
    if fmt not in _VALID_FORMATS:
        raise ValueError("The `data_format` argument must be one of 'channels_first', "
                         "'channels_last'. Received: %r" % (value,))
    return fmt


def cast_to_floatx(x):
    """A NumPy array of ``x`` in floatx()."""
    return np.asarray(x, dtype=floatx())


def backend():
    """The backend's name: 'cyback'."""
    return "cyback"


# ---------------------------------------------------------------- uids, scopes

_uids = defaultdict(int)
_uid_lock = threading.Lock()
_scope = threading.local()


def get_uid(prefix=""):
    """1, 2, 3, ... per prefix, until reset_uids() or clear_session()."""
    with _uid_lock:
        _uids[prefix] += 1
        return _uids[prefix]


def reset_uids():
    """Start every prefix's uids (get_uid) from 1 again."""
    with _uid_lock:
        _uids.clear()


def _scope_stack():
    if not hasattr(_scope, "stack"):
        _scope.stack = []
    return _scope.stack


def current_scope():
    return "/".join(_scope_stack())


class name_scope(object):
    """Context manager prefixing the names of tensors created inside it."""

    def __init__(self, name, *args, **kwargs):
        if not isinstance(name, str) or not name:
            raise ValueError("name_scope: expected a non-empty string, got %r" % (name,))
        self.name = name

    def __enter__(self):
        _scope_stack().append(self.name)
        return current_scope()

    def __exit__(self, *exc):
        _scope_stack().pop()
        return False


def scoped_name(name):
    prefix = current_scope()
    return prefix + "/" + name if prefix else name


# ------------------------------------------------------------------- threads

def get_num_threads():
    """Threads cyback's kernels use: the process's setting, the same in every
    thread."""
    from cyback.kernels import runtime
    return runtime.get_max_threads()


def set_num_threads(n):
    """Threads for cyback's kernels (``CYBACK_NUM_THREADS`` sets the start value).

    The setting is the process's: it holds in every Python thread, those
    running now and those started later (thread pools, Dask workers).
    Results are bit-identical from call to call at one setting; across
    settings the last bits of matrix products may differ (docs/threads.md).

    All of cyback's parallelism runs on one OpenMP thread pool; BLAS (NumPy's
    and SciPy's OpenBLAS) stays at one thread, because two pools on the same
    cores slow each other down (see cyback/kernels/linalg.pyx).
    """
    from cyback.kernels import runtime
    runtime.set_num_threads(n)


# Settings read at import (keras.json above, the environment variables through
# cyback/kernels/settings.py) follow one policy: a bad value is a ConfigWarning
# naming the setting, the value and the default used instead, never an error.
# Keras imports cyback, and a typo in a tuning variable must not stop a service
# from starting; the warning still says what to fix. The same values given in
# code (set_num_threads, set_floatx, ...) raise.

def _init_threads():
    from cyback.kernels import runtime
    from cyback.kernels.blas_threads import set_blas_threads
    _process.remove_bad_kernel_settings()
    runtime.set_parallel_min_work(_registry.get("CYBACK_PARALLEL_MIN_WORK"))
    warm = _registry.get("CYBACK_TEAM_WARM_US")
    if warm is not None:
        runtime.set_warm_window(min(1.0, warm * 1e-6))
    if _registry.raw("CYBACK_JOIN_US") is not None:
        runtime.set_join_window(_registry.get("CYBACK_JOIN_US") * 1e-6)
    n = _registry.get("CYBACK_NUM_THREADS")
    if n is None:
        # OpenMP counts the affinity mask but not a container's CPU quota.
        n = runtime.get_max_threads() if _registry.is_set("OMP_NUM_THREADS") else \
            _cpu_budget.default_threads()
    # Through set_num_threads even when OpenMP's own count is kept: that makes
    # the count the process's, for every thread (not only this one).
    set_num_threads(max(1, n))
    # CYBACK_BLAS_THREADS leaves BLAS with that many threads, for programs
    # whose own NumPy products matter more than cyback's.
    set_blas_threads(_registry.get("CYBACK_BLAS_THREADS"))


# ------------------------------------------------------------ learning phase

# The placeholder is a graph tensor: graph/tensor.py registers the function
# that makes it (register_learning_phase_factory), so config imports no graph.
_learning_phase = {"placeholder": None, "fixed": None, "factory": None}


def register_learning_phase_factory(factory):
    """``factory()`` makes the learning-phase placeholder when one is needed."""
    _learning_phase["factory"] = factory


def learning_phase_placeholder(create=True):
    """The symbolic learning phase (a bool scalar placeholder that is 0 unless
    fed); None if it does not exist yet and ``create`` is false."""
    ph = _learning_phase["placeholder"]
    if ph is None and create:
        ph = _learning_phase["factory"]()
        _learning_phase["placeholder"] = ph
    return ph


def learning_phase():
    """0 or 1 if set_learning_phase fixed it, else the symbolic placeholder."""
    fixed = _learning_phase["fixed"]
    if fixed is not None:
        return fixed
    return learning_phase_placeholder()


def fixed_learning_phase():
    return _learning_phase["fixed"]


def set_learning_phase(value):
    """Fix the learning phase: 0 (test) or 1 (train) for every function built
    afterwards, instead of the placeholder fed at each call."""
    if value not in (0, 1) or isinstance(value, float) and value not in (0.0, 1.0):
        raise ValueError("set_learning_phase: expected 0 (test) or 1 (train), got %r" % (value,))
    _learning_phase["fixed"] = int(value)


def reset_learning_phase():
    _learning_phase["placeholder"] = None
    _learning_phase["fixed"] = None
