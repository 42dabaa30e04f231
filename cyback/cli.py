"""The subcommands of ``python -m cyback`` that act on files: making cyback
Keras's default backend in keras.json, the settings, and inspecting or
running a model file (with ``cyback.saving``, imported only when asked for)."""
import json
import os
import sys
import tempfile

import numpy as np

from cyback.kernels import settings


class CommandError(Exception):
    """A failure to report in one message (exit status 1), not a traceback."""


# ------------------------------------------------------------ keras.json

def keras_home(environ=None):
    """Where multi-backend Keras keeps keras.json: $KERAS_HOME, else ~/.keras
    (/tmp/.keras when the home folder is not writable)."""
    if settings.is_set("KERAS_HOME", environ):
        return settings.raw("KERAS_HOME", environ)
    base = os.path.expanduser("~")
    if not os.access(base, os.W_OK):
        base = "/tmp"
    return os.path.join(base, ".keras")


#: What Keras 2.3.1 writes into a new keras.json, with cyback as the backend.
NEW_KERAS_JSON = {"floatx": "float32", "epsilon": 1e-07, "image_data_format": "channels_last",
                  "backend": "cyback"}


def set_default_backend(home=None, backend="cyback", out=None, environ=None):
    """Set keras.json's "backend" to ``backend`` in ``home`` (default: Keras's
    folder), keeping every other key; create the file (and folder) if missing.
    The new file replaces the old one in one step (written beside it, then
    renamed), so a reader never sees half a file. Returns the path."""
    out = sys.stdout if out is None else out
    home = keras_home(environ) if home is None else home
    path = os.path.join(home, "keras.json")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        text = None
    except (OSError, UnicodeDecodeError) as e:
        raise CommandError("cannot read %s: %s" % (path, e)) from None
    if text is None:
        config, before, mode = dict(NEW_KERAS_JSON, backend=backend), None, None
    else:
        try:
            config = json.loads(text)
        except ValueError as e:
            raise CommandError("%s is not valid JSON (%s); fix or remove it first, nothing "
                               "was changed" % (path, e)) from None
        if not isinstance(config, dict):
            raise CommandError("%s does not hold a JSON object; fix or remove it first, "
                               "nothing was changed" % path)
        before = config.get("backend")
        mode = os.stat(path).st_mode & 0o777
        if before == backend:
            print("%s already selects the %s backend; nothing changed" % (path, backend),
                  file=out)
            _note_override(backend, out, environ)
            return path
        config["backend"] = backend
    _write_atomically(path, json.dumps(config, indent=4) + "\n", mode)
    if text is None:
        print("created %s with \"backend\": \"%s\" (and Keras's defaults for floatx, "
              "epsilon and image_data_format)" % (path, backend), file=out)
    else:
        kept = sorted(k for k in config if k != "backend")
        print("%s: \"backend\" %s -> \"%s\"%s" % (
            path, json.dumps(before) if before is not None else "(unset)", backend,
            "; kept " + ", ".join(kept) if kept else ""), file=out)
    _note_override(backend, out, environ)
    return path


def _note_override(backend, out, environ):
    env_backend = settings.raw("KERAS_BACKEND", environ)
    if env_backend and env_backend != backend:
        print("note: KERAS_BACKEND=%s in this environment takes precedence over keras.json"
              % env_backend, file=out)


def _write_atomically(path, text, mode=None):
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".keras.json.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# ------------------------------------------------------------ settings

def settings_table(environ=None):
    """(name, value as set or '-', default) for every setting of cyback's own,
    and for the others that are set."""
    rows = []
    for s in settings.SETTINGS.values():
        if s.is_pattern:
            value = ", ".join("%s=%s" % kv for kv in sorted(settings.matching(s.name,
                                                                              environ).items()))
        else:
            value = settings.raw(s.name, environ)
        if s.owner != settings.CYBACK and not value:
            continue
        if s.read in (settings.TESTS, settings.BUILD) and not value:
            continue
        rows.append((s.name, value if value else "-", s.default_str().replace("`", "")))
    return rows


def print_settings(out=None, environ=None):
    out = sys.stdout if out is None else out
    rows = settings_table(environ)
    width = max(len(r[0]) for r in rows)
    vwidth = max(5, max(len(r[1]) for r in rows))
    print("%-*s  %-*s  %s" % (width, "setting", vwidth, "value", "default"), file=out)
    for name, value, default in rows:
        print("%-*s  %-*s  %s" % (width, name, vwidth, value, default), file=out)
    print("\nEvery setting, what it does and when it is read: docs/configuration.md "
          "(python -m cyback settings --write-docs PATH writes it)", file=out)


# ------------------------------------------------------------ model files

def _saving():
    """cyback.saving, imported only now (it imports Keras)."""
    try:
        import cyback.saving as saving
    except ImportError as e:
        if (e.name or "").startswith("cyback.saving"):
            raise CommandError("this cyback has no cyback.saving: it cannot read model "
                               "files") from None
        raise CommandError("reading model files needs multi-backend Keras 2.3.1 and h5py "
                           "(pip install \"keras==2.3.1\" h5py): %s" % e) from None
    return saving


_WRITERS = {"keras3": "Keras 3", "tf_keras": "tf.keras / tf_keras 2.x",
            "keras2": "multi-backend Keras 2.2/2.3"}


def describe_file(path):
    """(what wrote it, container) from the file's own metadata."""
    from cyback.saving import files
    try:
        with files.open_source(path) as source:
            writer = _WRITERS.get(source.writer, source.writer or "unknown")
            if source.keras_version:
                writer += " (keras_version %s)" % source.keras_version
            return writer, {"hdf5": "HDF5", "zip": ".keras archive"}.get(source.container,
                                                                         source.container)
    except (OSError, ValueError) as e:      # ModelFileError is a ValueError
        raise CommandError(str(e)) from None


def load(path, unsafe=False):
    saving = _saving()
    try:
        return saving.load_model(path, safe_mode=not unsafe)
    except OSError as e:
        raise CommandError(str(e)) from None
    except saving.UnsafeModelError as e:
        raise CommandError("%s\n(python -m cyback ... --unsafe loads it anyway)" % e) from None
    except (saving.ModelFileError, saving.UnsupportedLayersError,
            saving.WeightMismatchError) as e:
        raise CommandError(str(e)) from None


def _shape(shape):
    if isinstance(shape, list):
        return ", ".join(_shape(s) for s in shape)
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ")"


def inspect_model(path, unsafe=False, out=None):
    """Print the model's layers, their parameter counts and whether the file
    loads on cyback. Raises CommandError (with every unsupported layer) if
    it does not."""
    out = sys.stdout if out is None else out
    _saving()
    writer, container = describe_file(path)
    print("%s: %s, written by %s" % (path, container, writer), file=out)
    model = load(path, unsafe)
    import keras.backend as K
    rows = []
    for layer in model.layers:
        try:
            shape = _shape(layer.output_shape)
        except AttributeError:
            shape = "?"
        params = int(sum(K.count_params(w) for w in layer.weights))
        rows.append((layer.name, type(layer).__name__, shape, params))
    widths = [max(len(str(r[i])) for r in rows + [("layer", "class", "output shape",
                                                     "params")]) for i in range(4)]
    print("  %-*s  %-*s  %-*s  %*s" % (widths[0], "layer", widths[1], "class", widths[2],
                                       "output shape", widths[3], "params"), file=out)
    for name, cls, shape, params in rows:
        print("  %-*s  %-*s  %-*s  %*d" % (widths[0], name, widths[1], cls, widths[2], shape,
                                           widths[3], params), file=out)
    trainable = int(sum(K.count_params(w) for w in model.trainable_weights))
    total = int(model.count_params())
    print("parameters: %d (%d trainable, %d not)" % (total, trainable, total - trainable),
          file=out)
    print("inputs: %s; outputs: %s" % (_shape([tuple(t.shape.as_list()) if hasattr(
        t.shape, "as_list") else K.int_shape(t) for t in model.inputs]),
        _shape([K.int_shape(t) for t in model.outputs])), file=out)
    print("every layer is supported: the model loads and runs on cyback", file=out)
    return model


def _read_inputs(model, path):
    names = [t.name.split(":")[0] for t in model.inputs]
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise CommandError("cannot read %s as a NumPy .npy/.npz file (%s)" % (path, e)) from None
    if isinstance(data, np.ndarray):
        if len(names) != 1:
            raise CommandError("the model has %d inputs (%s): give an .npz file with one array "
                               "per input, named after them" % (len(names), ", ".join(names)))
        return [data]
    with data:
        keys = list(data.keys())
        if all(n in keys for n in names):
            return [data[n] for n in names]
        if len(keys) == len(names):
            return [data[k] for k in keys]
        raise CommandError("%s holds %s; the model's inputs are %s"
                           % (path, ", ".join(keys), ", ".join(names)))


def _check_shapes(model, arrays):
    import keras.backend as K
    for t, a in zip(model.inputs, arrays):
        want = K.int_shape(t)
        if a.ndim != len(want) or any(w is not None and w != d
                                      for w, d in zip(want[1:], a.shape[1:])):
            raise CommandError("the input %s has shape %s; the model takes %s (the first axis "
                               "is the batch)" % (t.name.split(":")[0], a.shape, _shape(want)))


def predict(path, input_path, output=None, batch_size=32, unsafe=False, out=None):
    """Run the model on the arrays in ``input_path``; save the predictions to
    ``output`` (.npy, or .npz for several outputs) or print them."""
    out = sys.stdout if out is None else out
    model = load(path, unsafe)
    arrays = _read_inputs(model, input_path)
    _check_shapes(model, arrays)
    result = model.predict(arrays if len(arrays) > 1 else arrays[0], batch_size=batch_size)
    results = result if isinstance(result, list) else [result]
    if output is None:
        for i, r in enumerate(results):
            print("output %d: shape %s, dtype %s" % (i, r.shape, r.dtype), file=out)
            print(np.array2string(r, threshold=200), file=out)
        return results
    if len(results) == 1 and not output.endswith(".npz"):
        np.save(output, results[0])
    else:
        np.savez(output, **{"output_%d" % i: r for i, r in enumerate(results)})
    print("wrote %s (%s)" % (output, "; ".join("shape %s %s" % (r.shape, r.dtype)
                                               for r in results)), file=out)
    return results


def _profile_inputs(model, batch):
    """Inputs of ``batch`` rows for the model's input shapes: standard normal
    floats, zeros for integer inputs (a valid index for any Embedding)."""
    import keras.backend as K
    rng = np.random.default_rng(0)
    arrays = []
    for t in model.inputs:
        shape = K.int_shape(t)
        if any(d is None for d in shape[1:]):
            raise CommandError("the input %s has shape %s with unknown sizes besides the batch: "
                               "give an input file (--input)" % (t.name.split(":")[0],
                                                                  _shape(shape)))
        dtype = np.dtype(K.dtype(t))
        full = (batch,) + tuple(shape[1:])
        arrays.append(np.zeros(full, dtype) if dtype.kind in "iub"
                      else rng.standard_normal(full).astype(dtype))
    return arrays


def profile_model(path, input_path=None, batch=1, calls=10, top=15, unsafe=False, out=None):
    """Time each step of the plan that predicts with the model in ``path``
    (cyback.graph.profile) on the inputs in ``input_path``, or on ``batch``
    rows of random inputs; print where the time goes."""
    out = sys.stdout if out is None else out
    model = load(path, unsafe)
    import keras.backend as K
    arrays = _read_inputs(model, input_path) if input_path else _profile_inputs(model, batch)
    _check_shapes(model, arrays)
    fn = K.function(model.inputs, model.outputs)
    result = fn.profile(arrays, calls=calls)
    from cyback import config
    print("%s at batch %d, %d thread(s): the median of %d runs" % (
        path, len(arrays[0]), config.get_num_threads(), calls), file=out)
    print(result.table(top), file=out)
    return result
