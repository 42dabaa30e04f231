"""cyback.quantize on Keras models: which layers turn int8, the int8 layers'
outputs against a NumPy reference of the documented computation, the model
around them unchanged, calibration data in every accepted form, saving and
loading, and the errors."""
import os

import keras
import numpy as np
import pytest

import cyback
import cyback.quantization as cq
from cyback.kernels import conv_utils
from cyback.layers.activations import relu6

K = keras.backend
L = keras.layers


def ref_codes(x, scale, zero):
    v = np.asarray(x, np.float32) / np.float32(scale)
    v = np.where(np.isnan(v), np.float32(-zero), v)
    v = np.clip(v, np.float32(-zero), np.float32(255 - zero))
    return np.rint(v).astype(np.int64) + zero


def ref_layer(layer, x):
    """A quantized layer's output from its weights and config, in NumPy:
    quantize the input, integer sums (padding at real 0), dequantize, bias,
    activation."""
    config = layer.get_config()
    weights = layer.get_weights()
    codes, scale = weights[0], weights[1]
    bias = weights[2] if config['use_bias'] else None
    q = ref_codes(x, config['input_scale'], config['input_zero_point']) - \
        config['input_zero_point']
    if isinstance(layer, cq.QuantizedDense):
        acc = q.reshape(-1, codes.shape[0]) @ codes.astype(np.int64)
        shape = x.shape[:-1] + (codes.shape[1],)
    else:
        rank = codes.ndim - 2
        window = codes.shape[:rank]
        sizes = x.shape[1:-1]
        st, dil, pad = config['strides'], config['dilation_rate'], config['padding']
        pads = [conv_utils.conv_pads(n, k, s, d, pad) for n, k, s, d in
                zip(sizes, window, st, dil)]
        out = [conv_utils.conv_output_length(n, k, s, d, pad) for n, k, s, d in
               zip(sizes, window, st, dil)]
        qp = np.pad(q, [(0, 0)] + pads + [(0, 0)])
        acc = np.zeros((x.shape[0],) + tuple(out) + (codes.shape[-1],), np.int64)
        for tap in np.ndindex(*window):
            sl = tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                       for t, d, o, s in zip(tap, dil, out, st))
            acc += np.einsum('...c,cf->...f', qp[(slice(None),) + sl],
                             codes[tap].astype(np.int64))
        shape = acc.shape
        acc = acc.reshape(-1, codes.shape[-1])
    y = acc.astype(np.int32).astype(np.float32) * (np.float32(config['input_scale']) * scale)
    if bias is not None:
        y = y + bias
    act = config['activation']
    if act in ('relu', 'relu6'):
        y = np.maximum(np.float32(0), y)
    if act == 'relu6':
        y = np.minimum(np.float32(6), y)
    y = y.reshape(shape)
    if act not in ('linear', 'relu', 'relu6'):
        y = K.eval(keras.activations.get(act)(K.constant(y)))
    return y


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def small_cnn():
    inp = L.Input((9, 10, 3), name='image')
    x = L.Conv2D(6, 3, padding='same', activation='relu', name='conv_a')(inp)
    x = L.BatchNormalization(name='bn')(x)
    x = L.Conv2D(8, (3, 2), strides=(2, 1), dilation_rate=1, name='conv_b')(x)
    x = L.Activation('relu')(x)
    x = L.Conv2D(5, 1, activation=relu6, name='pointwise')(x)
    x = L.Flatten()(x)
    x = L.Dense(12, activation='tanh', name='hidden')(x)
    out = L.Dense(4, activation='softmax', name='probs')(x)
    return keras.models.Model(inp, out, name='cnn')


def test_cnn_layers_turn_int8_and_match_the_reference(rng):
    model = small_cnn()
    data = rng.standard_normal((40, 9, 10, 3)).astype(np.float32)
    before = [w.copy() for w in model.get_weights()]
    q = cyback.quantize(model, data)
    kinds = {layer.name: type(layer).__name__ for layer in q.layers}
    assert kinds['conv_a'] == kinds['conv_b'] == kinds['pointwise'] == 'QuantizedConv2D'
    assert kinds['hidden'] == kinds['probs'] == 'QuantizedDense'
    assert kinds['bn'] == 'BatchNormalization'
    assert q.name == model.name and [t.name for t in q.inputs] != [] and \
        q.input_names == model.input_names and q.output_names == model.output_names
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    assert np.allclose(q.get_layer('bn').get_weights()[0], model.get_layer('bn').get_weights()[0])
    # each int8 layer computes the documented function of its own input
    for name in ('conv_a', 'conv_b', 'pointwise', 'hidden', 'probs'):
        layer = q.get_layer(name)
        x = keras.models.Model(q.inputs, layer.input).predict(data)
        y = keras.models.Model(q.inputs, layer.output).predict(data)
        want = ref_layer(layer, x)
        if name == 'probs' or name == 'hidden':
            np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-7)
        else:
            assert same_bits(y, want), name
    # and the model as a whole stays close to the float one
    yf, yq = model.predict(data), q.predict(data)
    assert np.abs(yf - yq).max() < 0.05


def test_weights_are_symmetric_per_channel_and_inputs_calibrated(rng):
    inp = L.Input((7,))
    out = L.Dense(3, name='d')(inp)
    model = keras.models.Model(inp, out)
    w = np.array([[0.5, -2.0, 0.0]] * 7, np.float32) * np.arange(1, 8)[:, None]
    model.get_layer('d').set_weights([w, np.array([0.1, 0.2, 0.3], np.float32)])
    data = rng.uniform(-1.0, 3.0, (50, 7)).astype(np.float32)
    q = cyback.quantize(model, data)
    layer = q.get_layer('d')
    codes, scale, bias = layer.get_weights()
    assert codes.dtype == np.int8 and scale.dtype == np.float32
    assert np.allclose(scale, [3.5 / 127, 14 / 127, 1.0])
    assert np.array_equal(codes[:, 2], np.zeros(7)) and np.abs(codes).max() == 127
    lo, hi = min(data.min(), 0), max(data.max(), 0)
    s, z = cq.scale_and_zero(lo, hi)
    assert layer.input_scale == s and layer.input_zero_point == z
    q1 = cyback.quantize(model, data, per_channel=False)
    assert np.all(q1.get_layer('d').get_weights()[1] == np.float32(14 / 127))
    q8 = cyback.quantize(model, data, activations='int8')
    assert q8.get_layer('d').input_zero_point == 128
    assert q8.get_layer('d').input_scale == np.float32(max(-lo, hi) / 127)
    x = data[:5]
    for m in (q, q1, q8):
        assert same_bits(m.predict(x), ref_layer(m.get_layer('d'), x))


def test_conv1d_dense_on_sequences_and_what_stays_float(rng):
    inp = L.Input((11, 4))
    x = L.Conv1D(5, 3, padding='causal', dilation_rate=2, activation='relu', name='causal')(inp)
    x = L.Conv1D(6, 2, strides=2, name='strided')(x)
    x = L.Dense(3, name='per_step')(x)               # on (batch, steps, features)
    seq = keras.models.Model(inp, x)
    data = rng.standard_normal((20, 11, 4)).astype(np.float32)
    q = cyback.quantize(seq, data)
    assert [type(layer).__name__ for layer in q.layers[1:]] == \
        ['QuantizedConv1D', 'QuantizedConv1D', 'QuantizedDense']
    for name in ('causal', 'strided', 'per_step'):
        layer = q.get_layer(name)
        xin = keras.models.Model(q.inputs, layer.input).predict(data)
        assert same_bits(keras.models.Model(q.inputs, layer.output).predict(data),
                         ref_layer(layer, xin)), name
    # transposed convolutions stay float32; channels_first, separable and
    # depthwise convolutions turn int8 (tests/quantization/test_convolutions.py)
    img = L.Input((6, 6, 4))
    y = L.SeparableConv2D(4, 3, padding='same', name='sep')(img)
    y = L.DepthwiseConv2D(3, padding='same', name='dw')(y)
    y = L.Conv2DTranspose(4, 3, padding='same', name='tconv')(y)
    y = L.Conv2D(4, 3, padding='same', data_format='channels_first', name='cf')(y)
    y = L.Conv2D(3, 1, name='kept')(y)
    other = keras.models.Model(img, y)
    q = cyback.quantize(other, rng.standard_normal((4, 6, 6, 4)).astype(np.float32),
                        skip=['kept'])
    assert [type(layer).__name__ for layer in q.layers[1:]] == \
        ['QuantizedSeparableConv2D', 'QuantizedDepthwiseConv2D', 'Conv2DTranspose',
         'QuantizedConv2D', 'Conv2D']


def test_sequential_shared_layers_and_several_inputs(rng):
    seq = keras.models.Sequential([L.Dense(8, activation='relu', input_shape=(5,), name='a'),
                                   L.Dropout(0.5), L.Dense(2, name='b')])
    data = rng.standard_normal((30, 5)).astype(np.float32)
    q = cyback.quantize(seq, data, method='percentile')
    assert isinstance(q, keras.models.Model)
    assert np.abs(q.predict(data) - seq.predict(data)).max() < 0.05
    # a layer called twice keeps one calibration over both inputs
    left, right = L.Input((4,), name='left'), L.Input((4,), name='right')
    shared = L.Dense(3, name='shared')
    out = L.Concatenate()([shared(left), shared(right)])
    two = keras.models.Model([left, right], out)
    xl = rng.uniform(-1, 1, (25, 4)).astype(np.float32)
    xr = rng.uniform(-5, 2, (25, 4)).astype(np.float32)
    q2 = cyback.quantize(two, [xl, xr])
    layer = q2.get_layer('shared')
    s, z = cq.scale_and_zero(min(xl.min(), xr.min()), max(xl.max(), xr.max()))
    assert (layer.input_scale, layer.input_zero_point) == (s, z)
    got = q2.predict([xl, xr])
    assert same_bits(got, np.concatenate([ref_layer(layer, xl), ref_layer(layer, xr)], -1))
    assert q2.input_names == ['left', 'right']


def test_calibration_data_forms(rng):
    inp = L.Input((6,))
    model = keras.models.Model(inp, L.Dense(2, name='d')(inp))
    data = rng.standard_normal((37, 6)).astype(np.float32)
    want = cyback.quantize(model, data).get_layer('d').get_config()
    forms = [
        lambda: [data[:10], data[10:]],                                  # a list of batches
        lambda: (b for b in np.array_split(data, 4)),                    # a generator
        lambda: [(data[:20], np.zeros(20)), (data[20:], np.zeros(17))],  # (x, y) batches
    ]
    for form in forms:
        cfg = cyback.quantize(model, form()).get_layer('d').get_config()
        assert cfg['input_scale'] == want['input_scale']
        assert cfg['input_zero_point'] == want['input_zero_point']
        # the histogram methods read a generator twice: it is kept as it is read
        cfg = cyback.quantize(model, form(), method='percentile', percentile=100)
        assert cfg.get_layer('d').input_scale == want['input_scale']
    with pytest.raises(ValueError, match='no samples'):
        cyback.quantize(model, data[:0])
    with pytest.raises(ValueError, match='no samples'):
        cyback.quantize(model, [])
    with pytest.raises(TypeError, match='iterable of batches'):
        cyback.quantize(model, 3.0)
    with pytest.raises(ValueError, match='1 inputs, a batch has 2'):
        cyback.quantize(model, [[data, data]])
    with pytest.raises(ValueError, match='batch_size'):
        cyback.quantize(model, data, batch_size=0)


def test_bad_arguments(rng):
    inp = L.Input((3,))
    model = keras.models.Model(inp, L.Dense(2, name='d')(inp))
    data = np.ones((4, 3), np.float32)
    with pytest.raises(TypeError, match='Keras model'):
        cyback.quantize('model', data)
    with pytest.raises(ValueError, match='activations'):
        cyback.quantize(model, data, activations='int4')
    with pytest.raises(ValueError, match='method'):
        cyback.quantize(model, data, method='mse')
    with pytest.raises(ValueError, match='does not have: nope'):
        cyback.quantize(model, data, skip=['d', 'nope'])
    with pytest.raises(TypeError, match='per_channel'):
        cyback.quantize(model, data, per_channel='yes')
    with pytest.raises(ValueError, match='no inputs yet'):
        cyback.quantize(keras.models.Sequential([L.Dense(2)]), data)
    with pytest.raises(ValueError, match='input_scale'):
        cq.QuantizedDense(2, input_scale=0.0)
    with pytest.raises(ValueError, match='input_zero_point'):
        cq.QuantizedDense(2, input_zero_point=300)
    with pytest.raises(ValueError, match='channels_last'):
        cq.QuantizedConv2D(2, 3, data_format='channels_middle')
    with pytest.raises(ValueError, match='channels_last'):
        cq.QuantizedDepthwiseConv2D(3, data_format='channels_first')
    with pytest.raises(ValueError, match='padding'):
        cq.QuantizedConv2D(2, 3, padding='causal')
    with pytest.raises(ValueError, match='kernel_size'):
        cq.QuantizedConv1D(2, (3, 3))
    # everything skipped: a float copy
    q = cyback.quantize(model, data, skip='d')
    assert type(q.get_layer('d')).__name__ == 'Dense'


def test_quantized_models_are_for_inference(rng):
    inp = L.Input((4,))
    x = L.Dense(5, name='float_first')(inp)
    model = keras.models.Model(inp, L.Dense(2, name='int8')(x))
    data = rng.standard_normal((10, 4)).astype(np.float32)
    q = cyback.quantize(model, data, skip=['float_first'])
    q.compile('sgd', 'mse')
    with pytest.raises(TypeError, match='no gradient.*inference'):
        q.fit(data, np.zeros((10, 2), np.float32), epochs=1, verbose=0)
    # and the backend function of the model works as predict does
    f = K.function(q.inputs, q.outputs)
    assert same_bits(f([data])[0], q.predict(data))


def test_save_and_load(tmp_path, rng):
    model = small_cnn()
    data = rng.standard_normal((16, 9, 10, 3)).astype(np.float32)
    q = cyback.quantize(model, data, method='entropy')
    want = q.predict(data)
    path = os.path.join(str(tmp_path), 'int8.h5')
    q.save(path)
    import h5py
    with h5py.File(path, 'r') as f:
        names = f['model_weights/conv_a'].attrs['weight_names']
        kernel = f['model_weights/conv_a'][names[0]]
        assert kernel.dtype == np.int8 and kernel.shape == (3, 3, 3, 6)
        config = f.attrs['model_config']
        config = config.decode() if isinstance(config, bytes) else config
        assert '"QuantizedConv2D"' in config and '"input_zero_point"' in config
    for load in (lambda: keras.models.load_model(path, custom_objects=cq.custom_objects()),
                 lambda: cyback.load_model(path, custom_objects=cq.custom_objects()),
                 lambda: cyback.load_model(path)):     # cyback.load_model knows them
        loaded = load()
        assert [type(a).__name__ for a in loaded.layers] == \
            [type(b).__name__ for b in q.layers]
        assert same_bits(loaded.predict(data), want)
        assert loaded.get_layer('hidden').get_config() == q.get_layer('hidden').get_config()
    with pytest.raises(ValueError, match='Unknown layer: QuantizedConv2D'):
        keras.models.load_model(path)


def test_text_cnn_and_nested_models(rng):
    # Embedding -> Conv1D -> pooling -> Dense: int inputs, float layers between
    tokens = L.Input((20,), dtype='int32', name='tokens')
    h = L.Embedding(50, 16, name='embed')(tokens)
    h = L.Conv1D(32, 3, activation='relu', padding='same', name='conv')(h)
    h = L.GlobalMaxPooling1D()(h)
    text = keras.models.Model(tokens, L.Dense(3, activation='softmax', name='out')(h))
    x = rng.integers(0, 50, (64, 20)).astype(np.int32)
    q = cyback.quantize(text, x)
    assert [type(layer).__name__ for layer in q.layers] == \
        ['InputLayer', 'Embedding', 'QuantizedConv1D', 'GlobalMaxPooling1D', 'QuantizedDense']
    assert q.inputs[0].dtype == 'int32'
    assert np.abs(q.predict(x) - text.predict(x)).max() < 0.02
    # a model used as a layer is copied with its weights, in float32
    inner_in = L.Input((6,))
    inner = keras.models.Model(inner_in, L.Dense(4, name='inner_dense')(inner_in), name='inner')
    outer_in = L.Input((6,))
    nested = keras.models.Model(outer_in, L.Dense(2, name='outer')(inner(outer_in)))
    xs = rng.standard_normal((10, 6)).astype(np.float32)
    qn = cyback.quantize(nested, xs)
    assert [type(layer).__name__ for layer in qn.layers] == \
        ['InputLayer', 'Model', 'QuantizedDense']
    assert type(qn.get_layer('inner').get_layer('inner_dense')).__name__ == 'Dense'
    assert np.array_equal(qn.get_layer('inner').get_weights()[0], inner.get_weights()[0])
    assert np.abs(qn.predict(xs) - nested.predict(xs)).max() < 0.05
