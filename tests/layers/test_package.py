"""cyback.layers as a package: Keras imported with the cyback backend (or a clear
error), and custom_objects() listing every layer and activation by config name."""
import os
import subprocess
import sys

import keras
import pytest

import cyback.layers


def _python(code, **env):
    full = dict(os.environ)
    full.pop('KERAS_BACKEND', None)
    full.update(env)
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          env=full, timeout=300)


def test_importing_selects_the_cyback_backend():
    result = _python('import cyback.layers, keras; print(keras.backend.backend())',
                     KERAS_BACKEND='theano')
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == 'cyback'


@pytest.mark.parametrize('version, backend, match', [
    ('2.3.1', 'theano', "imported with the 'theano' backend"),
    ('3.15.1', 'jax', 'version'),
])
def test_keras_on_another_backend_is_a_clear_error(version, backend, match):
    code = '\n'.join([
        'import sys, types',
        'fake = types.ModuleType("keras")',
        'fake.__version__ = %r' % version,
        'fake.backend = types.SimpleNamespace(backend=lambda: %r)' % backend,
        'sys.modules["keras"] = fake',
        'try:',
        '    import cyback.layers',
        'except ImportError as e:',
        '    print("ImportError:", e)',
    ])
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert 'ImportError:' in result.stdout and match in result.stdout, result.stdout


def test_custom_objects_lists_every_layer_under_its_class_name():
    objects = cyback.layers.custom_objects()
    for name, cls in cyback.layers.LAYERS.items():
        assert objects[name] is cls and cls.__name__ == name
        assert issubclass(cls, keras.engine.base_layer.Layer)
        # Each class says which weights it creates (names, shapes, order), or none.
        assert 'eights' in (cls.__dict__.get('__doc__') or ''), name
    for name in ('LayerNormalization', 'MultiHeadAttention', 'EinsumDense', 'Rescaling',
                 'Normalization', 'Resizing', 'CenterCrop', 'Conv1DTranspose',
                 'DepthwiseConv1D', 'GroupNormalization', 'UnitNormalization', 'Identity',
                 'LayerScale', 'StochasticDepth', 'gelu', 'swish', 'silu', 'hard_swish',
                 'hard_silu', 'mish', 'relu6', 'leaky_relu'):
        assert name in objects, name
    assert cyback.layers.custom_objects(keras3=True)['hard_sigmoid'] is \
        cyback.layers.activations.hard_sigmoid_keras3
