"""Checks shared by the cyback.layers tests: gradients of a layer by finite
differences (inputs and weights), and a small Keras model that trains one batch,
saves to HDF5 and loads back with cyback.layers.custom_objects()."""
import os

import keras
import numpy as np

import cyback.layers

from gradcheck import numeric_grad

K = keras.backend


def check_layer_grads(layer, inputs, call_kwargs=None, rtol=1e-5, atol=1e-6, eps=1e-6,
                      check_weights=True, output_index=0):
    """Compare K.gradients of ``sum(layer(inputs) * w)`` with central differences, with
    respect to every float input and every trainable weight. ``layer`` should hold
    float64 weights (``dtype='float64'``)."""
    single = not isinstance(inputs, (list, tuple))
    values = [np.asarray(v) for v in ([inputs] if single else inputs)]
    phs = [K.placeholder(shape=v.shape, dtype='float64' if v.dtype.kind == 'f' else v.dtype.name)
           for v in values]
    out = layer(phs[0] if single else phs, **(call_kwargs or {}))
    if isinstance(out, list):
        out = out[output_index]
    rs = np.random.RandomState(0)
    w = K.constant(rs.uniform(0.5, 1.5, size=K.int_shape(out)), dtype='float64')
    loss = K.sum(out * w)
    float_inputs = [i for i, v in enumerate(values) if v.dtype.kind == 'f']
    weights = list(layer.trainable_weights) if check_weights else []
    grads = K.gradients(loss, [phs[i] for i in float_inputs] + weights)
    f_loss = K.function(phs, [loss])
    f_grad = K.function(phs, grads)
    analytic = f_grad(values)
    for n, i in enumerate(float_inputs):
        def fi(xi, i=i):
            args = list(values)
            args[i] = xi
            return float(f_loss(args)[0])
        np.testing.assert_allclose(analytic[n], numeric_grad(fi, values[i], eps),
                                   rtol=rtol, atol=atol, err_msg='gradient of input %d' % i)
    for n, var in enumerate(weights):
        original = K.get_value(var)

        def fw(v, var=var):
            K.set_value(var, v)
            return float(f_loss(values)[0])
        try:
            numeric = numeric_grad(fw, original, eps)
        finally:
            K.set_value(var, original)
        np.testing.assert_allclose(analytic[len(float_inputs) + n], numeric, rtol=rtol,
                                   atol=atol, err_msg='gradient of weight %s' % var.name)


def fit_save_reload(model, x, y, tmp_path, loss='mse'):
    """Compile, fit one batch, save to .h5, load with custom_objects(); the reloaded
    model predicts the same. Returns the reloaded model."""
    model.compile('sgd', loss)
    before = [K.get_value(w).copy() for w in model.trainable_weights]
    model.fit(x, y, batch_size=len(x[0]) if isinstance(x, list) else len(x), epochs=1,
              verbose=0)
    after = [K.get_value(w) for w in model.trainable_weights]
    assert any(not np.array_equal(a, b) for a, b in zip(before, after)), \
        'fitting one batch changed no weight'
    expected = model.predict(x)
    path = os.path.join(str(tmp_path), 'model.h5')
    model.save(path)
    loaded = keras.models.load_model(path, custom_objects=cyback.layers.custom_objects())
    got = loaded.predict(x)
    if isinstance(expected, list):
        for e, g in zip(expected, got):
            np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    return loaded


def config_round_trip(layer):
    """``layer.__class__.from_config(layer.get_config())`` gives the same config."""
    config = layer.get_config()
    clone = layer.__class__.from_config(config)
    assert clone.get_config() == config
    return clone
