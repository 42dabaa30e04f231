"""Check that tf.keras application models load on cyback and match (optional,
not CI: it needs TensorFlow).

    .venv/bin/python benchmarks/check_applications.py --tf-python PYTHON [--all]
        [--keras3] [--time-load] [--size 96] [--keep DIR] [names...]

``PYTHON`` is the interpreter of an environment with TensorFlow, tf_keras and
(for ``--keras3``) Keras 3.

Two processes, because cyback runs under multi-backend Keras 2.3.1 while the
TensorFlow environment's ``keras`` is Keras 3 (both Python 3.11 / NumPy 2.4
here, so cyback's kernels would import there, but the two ``keras`` packages
cannot share one interpreter):

1. ``--make DIR`` (run by this script with ``--tf-python``): builds each
   ``tf_keras.applications`` model with random weights (the initializers,
   seeded random biases and normalization scales, BatchNormalization
   statistics set from a random calibration batch), saves it as
   ``<name>.h5`` (and ``<name>.keras`` with Keras 3 when ``--keras3``), and
   records its predictions on a seeded random batch in ``<name>.npz``;
2. this process loads every file with ``cyback.load_model`` and compares its
   predictions: the logits (``classifier_activation=None``), passing when the
   largest difference is at most 1e-4 times max(1, largest logit), or when
   cyback is no further from the float64 result of the same model than 3
   times the framework's own float32 result (deep random networks amplify
   rounding: TensorFlow's float32 and float64 logits of EfficientNetV2B3 at
   64x64 differ by 2e-4 of their scale).

``--time-load`` also times, once each, ``tf_keras.models.load_model`` and
``cyback.load_model`` on ResNet50's .h5 (25.6M parameters). One measurement
on a possibly busy machine: an indication, not a benchmark.

By default one model per family; ``--all`` builds every variant (hours, and
tens of GB of temporary files for the large ConvNeXt/EfficientNet/NASNet).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

FAMILIES = {
    'MobileNet': ['MobileNet'],
    'MobileNetV2': ['MobileNetV2'],
    'MobileNetV3': ['MobileNetV3Small', 'MobileNetV3Large'],
    'EfficientNet': ['EfficientNetB0', 'EfficientNetB1', 'EfficientNetB2', 'EfficientNetB3',
                     'EfficientNetB4', 'EfficientNetB5', 'EfficientNetB6', 'EfficientNetB7'],
    'EfficientNetV2': ['EfficientNetV2B0', 'EfficientNetV2B1', 'EfficientNetV2B2',
                       'EfficientNetV2B3', 'EfficientNetV2S', 'EfficientNetV2M',
                       'EfficientNetV2L'],
    'ResNet': ['ResNet50', 'ResNet101', 'ResNet152'],
    'ResNetV2': ['ResNet50V2', 'ResNet101V2', 'ResNet152V2'],
    'DenseNet': ['DenseNet121', 'DenseNet169', 'DenseNet201'],
    'Inception': ['InceptionV3', 'InceptionResNetV2'],
    'Xception': ['Xception'],
    'NASNet': ['NASNetMobile', 'NASNetLarge'],
    'ConvNeXt': ['ConvNeXtTiny', 'ConvNeXtSmall', 'ConvNeXtBase', 'ConvNeXtLarge',
                 'ConvNeXtXLarge'],
    'RegNet': ['RegNetX002', 'RegNetY002', 'RegNetX004', 'RegNetY004', 'RegNetX008',
               'RegNetY008', 'RegNetX016', 'RegNetY016', 'RegNetX032', 'RegNetY032',
               'RegNetX040', 'RegNetY040', 'RegNetX064', 'RegNetY064', 'RegNetX080',
               'RegNetY080', 'RegNetX120', 'RegNetY120', 'RegNetX160', 'RegNetY160',
               'RegNetX320', 'RegNetY320'],
}
DEFAULT = ['MobileNet', 'MobileNetV2', 'MobileNetV3Small', 'MobileNetV3Large',
           'EfficientNetB0', 'EfficientNetV2B0', 'ResNet50', 'ResNet50V2', 'DenseNet121',
           'InceptionV3', 'InceptionResNetV2', 'Xception', 'NASNetMobile', 'ConvNeXtTiny',
           'RegNetX002', 'RegNetY002']
# Models whose input size is fixed without ImageNet weights (NASNet) or that
# need a minimum size.
_FIXED_SIZE = {'NASNetMobile': 224, 'NASNetLarge': 331}
_MIN_SIZE = {'InceptionV3': 75, 'InceptionResNetV2': 75, 'Xception': 71}
TOLERANCE = 1e-4
BATCH = 2
SEED = 1234


# -- the TensorFlow half ----------------------------------------------------------

def _randomize(model, np, rng):
    for w in model.weights:
        name = w.name.split('/')[-1].split(':')[0]
        value = w.numpy()
        if not np.issubdtype(value.dtype, np.floating):
            continue
        # A Normalization layer's mean and variance stay: tf_keras's answers
        # from state its weights do not show once the model has been called
        # in training mode (the fixtures of tests/saving cover them).
        if name == 'moving_variance':
            value = rng.uniform(0.5, 1.5, value.shape)
        elif name == 'gamma':
            value = rng.uniform(0.7, 1.3, value.shape)
        elif name in ('bias', 'beta', 'moving_mean'):
            value = 0.1 * rng.standard_normal(value.shape)
        else:
            continue
        w.assign(value.astype(w.numpy().dtype))


def _calibrate(model, x):
    """Set every BatchNormalization's moving statistics to its batch
    statistics on ``x``: random moving statistics would let activations grow
    from block to block (to 1e10 in EfficientNetV2L), where float32 rounding
    differences grow with them and the comparison says nothing."""
    layers = [layer for layer in model.layers if type(layer).__name__ == 'BatchNormalization']
    momenta = [layer.momentum for layer in layers]
    for layer in layers:
        layer.momentum = 0.0
    model(x, training=True)
    for layer, momentum in zip(layers, momenta):
        layer.momentum = momentum


def _float64_outputs(module, name, side, model, x, np):
    """The same model in float64 on the same input: how far the framework's
    own float32 result is from it measures how much this random network
    amplifies rounding, the floor for any float32 implementation."""
    # tf_keras builds layers in floatx; Keras 3 in the global dtype policy.
    keras3 = hasattr(module, 'config') and hasattr(module.config, 'set_dtype_policy')
    if keras3:
        saved = module.config.dtype_policy()
        module.config.set_dtype_policy('float64')
    else:
        saved = module.backend.floatx()
        module.backend.set_floatx('float64')
    try:
        twin = getattr(module.applications, name)(
            weights=None, input_shape=(side, side, 3), classifier_activation=None)
        twin.set_weights([w.astype('float64') for w in model.get_weights()])
        return np.asarray(twin(x.astype('float64'), training=False)).astype('float64')
    finally:
        if keras3:
            module.config.set_dtype_policy(saved)
        else:
            module.backend.set_floatx(saved)


def make(outdir, names, size, keras3, time_load):
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
    import numpy as np
    import tensorflow as tf
    import tf_keras
    report = {'versions': {'tensorflow': tf.__version__, 'tf_keras': tf_keras.__version__}}
    if keras3:
        import keras
        report['versions']['keras'] = keras.__version__
    for name in names:
        entry = report.setdefault(name, {})
        side = _FIXED_SIZE.get(name, max(size, _MIN_SIZE.get(name, 0)))
        for framework, module in (('tf_keras', tf_keras),) + (
                (('keras3', keras),) if keras3 else ()):
            module.backend.clear_session()
            module.utils.set_random_seed(SEED)
            rng = np.random.default_rng(SEED)
            model = None
            if not hasattr(module.applications, name):
                entry[framework] = {'absent': True}
                continue
            try:
                # Logits, not probabilities: over 1000 classes a softmax
                # output is ~1e-3, too small for an absolute tolerance.
                model = getattr(module.applications, name)(
                    weights=None, input_shape=(side, side, 3), classifier_activation=None)
                _randomize(model, np, rng)
                _calibrate(model, rng.uniform(0, 255, (8, side, side, 3)).astype('float32'))
                x = rng.uniform(0, 255, (BATCH, side, side, 3)).astype('float32')
                y64 = _float64_outputs(module, name, side, model, x, np)
                path = os.path.join(outdir, '%s.%s.%s' % (
                    name, framework, 'h5' if framework == 'tf_keras' else 'keras'))
                model.save(path)
                # The reference is the saved file's own prediction: after the
                # calibrating call, tf_keras's in-memory EfficientNet answers
                # differently from its saved weights (the file is the truth).
                try:
                    saved = module.models.load_model(path, compile=False)
                except (ValueError, TypeError):
                    # tf_keras cannot reload its own ConvNeXt (LayerScale is
                    # not registered): the in-memory model answers.
                    saved = model
                y = np.asarray(saved(x, training=False))
                del saved
                np.savez(os.path.join(outdir, '%s.%s.npz' % (name, framework)), x=x, y=y,
                         y64=y64)
                entry[framework] = {'path': path, 'params': int(model.count_params()),
                                    'size': side}
            except Exception as e:  # report, and go on with the next model
                entry[framework] = {'error': '%s: %s' % (type(e).__name__, e)}
            del model
    if time_load:
        tf_keras.backend.clear_session()
        model = tf_keras.applications.ResNet50(weights=None)
        path = os.path.join(outdir, 'ResNet50_224.h5')
        model.save(path)
        params = int(model.count_params())
        del model
        tf_keras.backend.clear_session()
        start = time.perf_counter()
        tf_keras.models.load_model(path, compile=False)
        report['load_time'] = {'path': path, 'params': params,
                               'tf_keras_seconds': time.perf_counter() - start}
    with open(os.path.join(outdir, 'made.json'), 'w') as f:
        json.dump(report, f, indent=1)


# -- the cyback half ----------------------------------------------------------------

def check(outdir):
    import numpy as np

    import cyback
    with open(os.path.join(outdir, 'made.json')) as f:
        report = json.load(f)
    rows = []
    for name, entry in report.items():
        if name in ('versions', 'load_time'):
            continue
        for framework, made in entry.items():
            if made.get('absent'):
                continue  # an application this framework does not have
            if 'error' in made:
                rows.append((name, framework, 'NOT MADE', made['error'][:120]))
                continue
            data = np.load(os.path.join(outdir, '%s.%s.npz' % (name, framework)))
            try:
                model = cyback.load_model(made['path'])
                got = model.predict(data['x'], batch_size=BATCH)
            except Exception as e:
                rows.append((name, framework, 'FAIL', '%s: %s' % (type(e).__name__,
                                                                  str(e)[:300])))
                continue
            err = float(np.max(np.abs(got - data['y'])))
            scale = max(1.0, float(np.max(np.abs(data['y']))))
            # The framework's own float32 distance to float64, and cyback's.
            floor = float(np.max(np.abs(data['y'] - data['y64'])))
            err64 = float(np.max(np.abs(got - data['y64'])))
            close = err <= TOLERANCE * scale or err64 <= 3 * floor
            rows.append((name, framework, 'pass' if close else 'MISMATCH',
                         'max |diff| %.2e (logits up to %.2g); to float64: cyback %.2e, '
                         'the framework %.2e; %d params, %dx%d input'
                         % (err, scale, err64, floor, made['params'], made['size'],
                            made['size'])))
    print('%-20s %-9s %-9s %s' % ('model', 'file', 'result', 'detail'))
    for row in rows:
        print('%-20s %-9s %-9s %s' % row)
    passed = sum(r[2] == 'pass' for r in rows)
    print('%d of %d pass' % (passed, len(rows)))
    timing = report.get('load_time')
    if timing:
        start = time.perf_counter()
        cyback.load_model(timing['path'])
        seconds = time.perf_counter() - start
        print('load time, ResNet50 .h5 (%d params), once each: tf_keras.models.load_model '
              '%.2f s, cyback.load_model %.2f s (ratio %.2f)'
              % (timing['params'], timing['tf_keras_seconds'], seconds,
                 seconds / timing['tf_keras_seconds']))
    print('versions:', report['versions'])
    return passed == len(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('names', nargs='*')
    parser.add_argument('--all', action='store_true', help='every variant of every family')
    parser.add_argument('--keras3', action='store_true', help='Keras 3 .keras files too')
    parser.add_argument('--size', type=int, default=96, help='input side (default 96)')
    parser.add_argument('--tf-python',
                        help='a Python with TensorFlow and tf_keras (and Keras 3)')
    parser.add_argument('--keep', help='directory for the files (default: a temporary one)')
    parser.add_argument('--time-load', action='store_true',
                        help='time loading ResNet50 in both frameworks, once')
    parser.add_argument('--make', help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = args.names or ([n for family in FAMILIES.values() for n in family]
                           if args.all else DEFAULT)
    if args.make:
        make(args.make, names, args.size, args.keras3, args.time_load)
        return 0
    if not args.tf_python:
        parser.error('give --tf-python, the interpreter of an environment with TensorFlow '
                     'and tf_keras (cyback\'s own has neither)')
    with tempfile.TemporaryDirectory(prefix='cyback-apps-') as tmp:
        outdir = args.keep or tmp
        os.makedirs(outdir, exist_ok=True)
        command = [args.tf_python, os.path.abspath(__file__), '--make', outdir,
                   '--size', str(args.size)] + names
        command += ['--keras3'] if args.keras3 else []
        command += ['--time-load'] if args.time_load else []
        # Keras 3 there must not take cyback's backend from this process
        # (or from a keras.json that names cyback).
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', KERAS_BACKEND='tensorflow')
        subprocess.run(command, check=True, env=env)
        return 0 if check(outdir) else 1


if __name__ == '__main__':
    sys.exit(main())
