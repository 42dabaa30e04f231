"""int8 layers in inference plans hand uint8 codes to the int8 layer after
them: the writer requantizes its output in its epilogue (after the
BatchNormalization, bias and relu / relu6 it took in), the reader skips its
quantization pass. The codes are the ones the reader would have made from
the float32 output, so the plan's results keep their bits."""
import keras
import numpy as np
import pytest
from unoptimized import optimizer_off, run_unoptimized

import cyback
from cyback.ops import quantized as qops

K = keras.backend


def _batchnorms_made_non_trivial(model, rng):
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            c = layer.get_weights()[0].shape[0]
            gamma = rng.uniform(0.5, 1.5, c)
            gamma[::3] *= -1
            layer.set_weights([gamma, rng.normal(0, 0.3, c), rng.normal(0, 0.3, c),
                               rng.uniform(0.5, 1.5, c)])
    return model


def _inverted_residual(rng):
    inp = keras.layers.Input((10, 9, 6))
    x = keras.layers.Conv2D(12, 1, use_bias=False)(inp)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU(6.0)(x)
    x = keras.layers.DepthwiseConv2D(3, padding='same', depth_multiplier=2,
                                     use_bias=False)(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU(6.0)(x)
    x = keras.layers.Conv2D(6, 1, use_bias=False)(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Add()([x, inp])
    return keras.models.Model(inp, x), (10, 9, 6)


def _bottleneck(rng):
    # a ResNet block: the residual sum is float32, the convolutions inside
    # pass codes
    inp = keras.layers.Input((9, 9, 8))
    x = keras.layers.Conv2D(4, 1)(inp)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Activation('relu')(x)
    x = keras.layers.Conv2D(4, 3, padding='same')(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Activation('relu')(x)
    x = keras.layers.Conv2D(8, 1)(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Add()([x, inp])
    x = keras.layers.Activation('relu')(x)
    x = keras.layers.Conv2D(5, 3, strides=2)(x)
    return keras.models.Model(inp, x), (9, 9, 8)


def _separable(rng):
    inp = keras.layers.Input((11, 8, 3))
    x = keras.layers.SeparableConv2D(7, 3, padding='same', activation='relu')(inp)
    x = keras.layers.SeparableConv2D(5, 3, strides=2, use_bias=False)(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Conv2D(4, 2)(x)
    return keras.models.Model(inp, x), (11, 8, 3)


def _mlp(rng):
    inp = keras.layers.Input((5, 13))
    x = keras.layers.Dense(17, activation='relu')(inp)
    x = keras.layers.Dense(9)(x)
    x = keras.layers.ReLU(6.0)(x)
    x = keras.layers.Dense(3, activation='softmax')(x)
    return keras.models.Model(inp, x), (5, 13)


def _conv1d(rng):
    inp = keras.layers.Input((20, 4))
    x = keras.layers.Conv1D(8, 3, padding='causal', dilation_rate=2, activation='relu')(inp)
    x = keras.layers.Conv1D(6, 5, strides=2)(x)
    return keras.models.Model(inp, x), (20, 4)


def _two_blocks(rng):
    # the first block's output is read by the second block's convolution
    # (codes) and by its residual sum (float32): its epilogue makes both
    inp = keras.layers.Input((7, 7, 8))
    x = inp
    for _ in range(2):
        y = keras.layers.Conv2D(8, 3, padding='same')(x)
        y = keras.layers.BatchNormalization()(y)
        x = keras.layers.Activation('relu')(keras.layers.Add()([y, x]))
    x = keras.layers.Conv2D(4, 1)(x)                # and two read codes only
    z = keras.layers.Conv2D(4, 1, strides=2)(x)
    w = keras.layers.Conv2D(4, 1, strides=2)(x)
    return keras.models.Model(inp, [z, w]), (7, 7, 8)


@pytest.fixture(autouse=True)
def _float_residuals(monkeypatch):
    # bits with codes between layers against bits without: residual sums keep
    # their float32 operand here (tests/quantization/test_quantized_residual.py
    # has the residuals read as codes)
    monkeypatch.setattr(qops._Quantized, 'quantized_residual', False)


MODELS = {'inverted_residual': _inverted_residual, 'bottleneck': _bottleneck,
          'separable': _separable, 'mlp': _mlp, 'conv1d': _conv1d, 'two_blocks': _two_blocks}


def _labels(function):
    return [op.describe() if hasattr(op, 'describe') else (op.api or type(op).__name__)
            for op in function.plan_ops()]


def _quantized(name, seed=0):
    rng = np.random.RandomState(seed)
    model, shape = MODELS[name](rng)
    _batchnorms_made_non_trivial(model, rng)
    data = rng.standard_normal((24,) + shape).astype('float32')
    return model, cyback.quantize(model, data), data


def _compiled(q, x):
    # a function's plan is made by its first call
    f = K.function(q.inputs, q.outputs)
    return f, f([x])[0]


def _chaining_off(monkeypatch, q, x):
    with monkeypatch.context() as m:
        m.setattr(qops._Quantized, 'chaining', False)
        return _compiled(q, x)


@pytest.mark.parametrize('name', sorted(MODELS))
def test_codes_between_int8_layers_keep_the_bits(name, monkeypatch):
    model, q, data = _quantized(name)
    f, got = _compiled(q, data)
    labels = _labels(f)
    assert any('(uint8 in' in label for label in labels), labels
    f_off, want = _chaining_off(monkeypatch, q, data)
    assert not any('uint8' in label for label in _labels(f_off))
    assert got.dtype == want.dtype == np.float32
    assert got.tobytes() == want.tobytes()
    # one batch row at a time gives the rows' bits too
    rows = np.concatenate([f([data[i:i + 1]])[0] for i in range(3)])
    assert rows.tobytes() == got[:3].tobytes()
    # and the plan still tracks the float model
    ref = model.predict(data)
    ref = ref[0] if isinstance(ref, list) else ref
    assert np.abs(got - ref).max() < 0.1 * np.abs(ref).max()


def test_which_layers_pass_codes():
    _, q, data = _quantized('inverted_residual')
    labels = _labels(_compiled(q, data)[0])
    # the block's sum with its input is the projection's epilogue, float32
    # out: the model's output
    assert labels == ['quantized_conv relu6 (uint8 out)',
                      'quantized_depthwise_conv relu6 (uint8 in, uint8 out)',
                      'quantized_conv + residual (uint8 in)'], labels
    _, q, data = _quantized('bottleneck')
    labels = _labels(_compiled(q, data)[0])
    assert labels == ['quantized_conv relu (uint8 out)',
                      'quantized_conv relu (uint8 in, uint8 out)',
                      'quantized_conv + residual relu (uint8 in, uint8 out)',
                      'quantized_conv (uint8 in)'], labels


def test_an_output_several_int8_layers_read_is_made_as_codes_too():
    _, q, data = _quantized('two_blocks')
    labels = _labels(_compiled(q, data)[0])
    assert labels == ['quantized_conv + residual relu (float32 and uint8 out)',
                      'quantized_conv + residual relu (uint8 in, uint8 out)',
                      'quantized_conv (uint8 in, uint8 out)',
                      'quantized_conv (uint8 in)', 'quantized_conv (uint8 in)'], labels


def test_float_readers_keep_the_float_output():
    rng = np.random.RandomState(4)
    inp = keras.layers.Input((8, 8, 3))
    a = keras.layers.Conv2D(6, 3, activation='relu', name='a')(inp)
    b = keras.layers.Conv2D(4, 3, name='b')(a)                  # a is also an output
    c = keras.layers.LeakyReLU(0.1)(keras.layers.Conv2D(5, 1, name='c')(inp))
    d = keras.layers.Conv2D(3, 1, name='d')(c)                 # a float op between
    model = keras.models.Model(inp, [a, b, d])
    data = rng.standard_normal((10, 8, 8, 3)).astype('float32')
    q = cyback.quantize(model, data)
    f = K.function(q.inputs, q.outputs)
    got = f([data])
    # a is a model output and b's input: its epilogue makes both; the
    # LeakyReLU between c and d is a float op, so d quantizes its input
    assert _labels(f) == ['quantized_conv relu (float32 and uint8 out)',
                          'quantized_conv (uint8 in)', 'quantized_conv + relu',
                          'quantized_conv'], _labels(f)
    want = run_unoptimized(q.inputs, q.outputs, [data])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.abs(w).max())


def test_thread_counts_and_an_empty_batch_give_the_same_bits():
    _, q, data = _quantized('inverted_residual', seed=5)
    f = K.function(q.inputs, q.outputs)
    before = cyback.get_num_threads()
    try:
        cyback.set_num_threads(1)
        one = f([data])[0]
        cyback.set_num_threads(2)
        two = f([data])[0]
    finally:
        cyback.set_num_threads(before)
    assert one.tobytes() == two.tobytes()
    assert f([data[:0]])[0].shape == (0,) + one.shape[1:]


def test_codes_ops_check_their_input_and_describe_themselves(rng):
    w = rng.integers(-127, 128, (6, 4), dtype=np.int8)
    packed = qops.PackInt8()(K.constant(w, dtype='int8'))
    vectors = qops.EpilogueVectors(0.1)(K.constant(np.ones(4, np.float32)))
    reader = qops.QuantizedDense(4, 0.1, 3, 'relu')._with(codes_in=True)
    with pytest.raises(ValueError, match='expected uint8 codes, got float32'):
        reader(K.placeholder(shape=(None, 6)), packed, vectors)
    codes = K.placeholder(shape=(None, 6), dtype='uint8')
    y = reader(codes, packed, vectors)
    assert y.dtype == 'float32' and reader.describe() == 'quantized_dense relu (uint8 in)'
    writer = reader._with(out_codes=(0.05, 7))
    y = writer(codes, packed, vectors)
    assert y.dtype == 'uint8' and writer.describe() == 'quantized_dense relu (uint8 in, uint8 out)'
    # a codes writer takes no more of what follows it into its epilogue
    assert writer.absorb_activation([codes, packed, vectors], 'relu', None) is None
    assert not writer.kernel_epilogue(-1, 'relu', y)
    # the op itself: codes in and out against the kernel called directly
    from cyback.kernels import qgemm
    xv = rng.integers(0, 256, (5, 6), dtype=np.uint8)
    f = K.function([codes], [y])
    want = qgemm.gemm(xv, qgemm.pack_weights(w), 0.1, 3, np.ones(4, np.float32),
                      activation='relu', out_scale=0.05, out_zero_point=7)
    assert f([xv])[0].tobytes() == want.tobytes()


@pytest.mark.parametrize('name', ['bottleneck', 'inverted_residual', 'two_blocks'])
def test_residual_sum_in_the_int8_epilogue_keeps_the_bits(name, monkeypatch):
    # the block's sum with its input (then relu) is the product's epilogue:
    # taken in by the plan's rewrites, by the fused step's epilogue, or
    # added by the fused step after the product, the same bits
    _, q, data = _quantized(name, seed=6)
    f = K.function(q.inputs, q.outputs)
    got = f([data])
    assert any('+ residual' in label for label in _labels(f))
    with monkeypatch.context() as m:
        m.setattr(qops._Quantized, 'absorb_residual', lambda self, inputs, r, ctx: None)
        m.setattr(qops._Quantized, 'chaining', False)
        f_fused = K.function(q.inputs, q.outputs)
        in_kernel = f_fused([data])
        fused = [op for op in f_fused.plan_ops() if type(op).__name__ == 'Fused']
        assert fused and all(op.in_kernel is not None and op.in_kernel[1] is not None
                             for op in fused), [op.describe() for op in fused]
        m.setattr(qops._Quantized, '_takes_residual', lambda self: False)
        f_off = K.function(q.inputs, q.outputs)
        after = f_off([data])
        assert all(op.in_kernel is None for op in f_off.plan_ops()
                   if type(op).__name__ == 'Fused')
    for g, i, a in zip(got, in_kernel, after):
        assert g.tobytes() == i.tobytes() == a.tobytes()


def test_residual_of_another_shape_runs_outside_the_kernel(rng):
    # a residual whose run-time shape differs from the output's (it
    # broadcasts) is left to the fused step
    w = rng.integers(-127, 128, (6, 4), dtype=np.int8)
    op = qops.QuantizedDense(4, 0.1, 3)
    packed = np.asarray(qops.PackInt8().compute(w)[0])
    vectors = qops.EpilogueVectors(0.1).compute(np.ones(4, np.float32))[0]
    x = rng.standard_normal((5, 6)).astype(np.float32)
    assert op.compute_epilogue([x, packed, vectors], None, 'relu',
                               np.ones((1, 4), np.float32)) is None
    assert op.compute_epilogue([x, packed, vectors], None, 'relu',
                               np.ones((5, 4), np.float64)) is None
    full = op.compute_epilogue([x, packed, vectors], None, 'relu', np.ones((5, 4), np.float32))
    want = np.maximum(op.compute(x, packed, vectors)[0] + np.float32(1), 0)
    assert full.tobytes() == want.tobytes()


def test_ops_are_remade_after_a_plan_was_pickled():
    # pickling puts a reducer for every op class in copyreg's table, which
    # copy.copy cannot use; the plan rewrites must not depend on it
    import pickle
    _, q, data = _quantized('mlp', seed=7)
    pickle.dumps(K.function(q.inputs, q.outputs))
    f, got = _compiled(q, data)
    assert any('uint8' in label for label in _labels(f))
    assert np.isfinite(got).all()


def test_a_residual_that_broadcasts_at_run_time_is_added_after_the_product():
    # statically the shortcut has the output's shape; fed with one row for
    # three, it broadcasts, and the epilogue leaves the sum to NumPy
    rng = np.random.RandomState(8)
    x_in, r_in = keras.layers.Input((5, 5, 3)), keras.layers.Input((5, 5, 6))
    y = keras.layers.Conv2D(6, 3, padding='same', name='conv')(x_in)
    y = keras.layers.Activation('relu')(keras.layers.Add()([y, r_in]))
    y = keras.layers.Conv2D(2, 1, name='after')(y)
    model = keras.models.Model([x_in, r_in], y)
    x = rng.standard_normal((3, 5, 5, 3)).astype('float32')
    r = rng.standard_normal((3, 5, 5, 6)).astype('float32')
    q = cyback.quantize(model, [x, r])
    f = K.function(q.inputs, q.outputs)
    assert _labels(f) == ['quantized_conv + residual relu (uint8 out)',
                          'quantized_conv (uint8 in)'], _labels(f)
    got_full, got_broadcast = f([x, r])[0], f([x, r[:1]])[0]
    with optimizer_off():
        plain = K.function(q.inputs, q.outputs)
        want_full, want_broadcast = plain([x, r])[0], plain([x, r[:1]])[0]
    for got, want in ((got_full, want_full), (got_broadcast, want_broadcast)):
        assert got.shape == want.shape == (3, 5, 5, 2)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_a_depthwise_output_read_by_int8_and_float_layers_stays_float32():
    # the depthwise kernel writes one output: float32 for every reader here
    rng = np.random.RandomState(9)
    inp = keras.layers.Input((6, 6, 4))
    d = keras.layers.DepthwiseConv2D(3, padding='same', name='dw')(inp)
    a = keras.layers.Conv2D(3, 1, name='a')(d)
    b = keras.layers.Conv2D(3, 1, name='b')(d)
    model = keras.models.Model(inp, [a, b, keras.layers.Activation('tanh')(d)])
    data = rng.standard_normal((5, 6, 6, 4)).astype('float32')
    q = cyback.quantize(model, data)
    f = K.function(q.inputs, q.outputs)
    got = f([data])
    assert _labels(f)[0] == 'quantized_depthwise_conv', _labels(f)
    ref = model.predict(data)
    for g, w in zip(got, ref):
        assert np.abs(g - w).max() < 0.1 * np.abs(w).max()


def _stem(relu=True, pool='max', pool_is_output=False, data_format='channels_last'):
    # a ResNet stem: conv, relu, zero padding, 3x3/2 max pool, then two int8
    # convolutions reading the pool (the block's first one and its shortcut)
    inp = keras.layers.Input((12, 11, 3))
    x = keras.layers.Conv2D(8, 3, strides=2, padding='same',
                            activation='relu' if relu else None, name='stem')(inp)
    x = keras.layers.ZeroPadding2D(1)(x)
    layer = keras.layers.MaxPooling2D if pool == 'max' else keras.layers.AveragePooling2D
    p = layer(3, strides=2)(x)
    a = keras.layers.Conv2D(4, 1, name='a')(p)
    b = keras.layers.Conv2D(6, 3, padding='same', name='b')(p)
    outputs = [a, b, p] if pool_is_output else [a, b]
    return keras.models.Model(inp, outputs)


@pytest.mark.parametrize('kind', ['codes', 'not_relu', 'average', 'pool_is_output'])
def test_codes_through_zero_padding_and_max_pooling(kind, monkeypatch):
    rng = np.random.RandomState(10)
    model = _stem(relu=kind != 'not_relu', pool='average' if kind == 'average' else 'max',
                  pool_is_output=kind == 'pool_is_output')
    if kind == 'not_relu':
        # pooled values below 0: the readers' zero point is not 0
        kernel, bias = model.get_layer('stem').get_weights()
        model.get_layer('stem').set_weights([kernel, bias - 4.0])
    data = rng.standard_normal((6, 12, 11, 3)).astype('float32')
    q = cyback.quantize(model, data)
    f = K.function(q.inputs, q.outputs)
    got = f([data])
    labels = _labels(f)
    if kind == 'codes':
        # a relu's codes have zero point 0: zeros pad them as they pad 0.0
        assert labels == ['quantized_conv relu (uint8 out)', 'spatial_2d_padding', 'pool2d',
                          'quantized_conv (uint8 in)', 'quantized_conv (uint8 in)'], labels
    else:
        assert 'uint8 out' not in labels[0] and 'uint8' not in ' '.join(labels[3:]), labels
        if kind == 'not_relu':
            assert q.get_layer('a').get_config()['input_zero_point'] > 0
    with monkeypatch.context() as m:
        m.setattr(qops._Quantized, 'chaining', False)
        want = K.function(q.inputs, q.outputs)([data])
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.tobytes() == w.tobytes()


@pytest.mark.parametrize('shape,pool_size,strides,padding,channels_last', [
    ((2, 9, 7, 5), (3, 3), (2, 2), 'same', True),
    ((2, 5, 9, 7), (2, 3), (1, 2), 'valid', False),
    ((3, 11, 4), (3,), (2,), 'same', True),
])
def test_max_pool_of_codes_equals_codes_of_the_max_pool(rng, shape, pool_size, strides,
                                                        padding, channels_last):
    # a max commutes with a monotone quantization: codes of the float pool
    from cyback.kernels import qgemm
    from cyback.ops.pool import Pool
    op = Pool('pool%dd' % len(pool_size), pool_size, strides, padding, channels_last, 'max')
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    codes = qgemm.quantize(x, 0.05, 60)
    got = op.compute(codes)[0]
    want = qgemm.quantize(np.ascontiguousarray(op.compute(x)[0]), 0.05, 60)
    assert got.dtype == np.uint8 and got.tobytes() == want.tobytes()


def test_codes_through_a_global_max_pooling(monkeypatch):
    # a text CNN: the convolution hands codes to the max over time, whose
    # reader (a Dense) takes them
    rng = np.random.RandomState(11)
    inp = keras.layers.Input((30,), dtype='int32')
    x = keras.layers.Embedding(50, 8)(inp)
    x = keras.layers.Conv1D(12, 3, activation='relu')(x)
    x = keras.layers.GlobalMaxPooling1D()(x)
    x = keras.layers.Dense(3, activation='softmax')(x)
    model = keras.models.Model(inp, x)
    data = rng.randint(0, 50, (9, 30)).astype('int32')
    q = cyback.quantize(model, data)
    f = K.function(q.inputs, q.outputs)
    got = f([data])[0]
    # the embedding table's codes are made once (with the frozen weights)
    # and gathered; the max over time joins the convolution
    # (tests/ops/test_quantized_extreme.py)
    assert _labels(f)[:3] == ['gather',
                              'quantized_conv relu (uint8 in, uint8 out) > max over positions',
                              'quantized_dense (uint8 in)'], _labels(f)
    f_off, want = _chaining_off(monkeypatch, q, data)
    assert got.tobytes() == want.tobytes()
    assert f([data[:0]])[0].shape == (0, 3)



@pytest.mark.parametrize('also_float', [False, True])
def test_an_embedding_gathers_codes_for_a_quantized_lstm(also_float, monkeypatch):
    rng = np.random.RandomState(12)
    inp = keras.layers.Input((9,), dtype='int32')
    e = keras.layers.Embedding(40, 6)(inp)
    h = keras.layers.LSTM(5)(e)
    outputs = [h, keras.layers.GlobalAveragePooling1D()(e)] if also_float else h
    model = keras.models.Model(inp, outputs)
    data = rng.randint(0, 40, (7, 9)).astype('int32')
    q = cyback.quantize(model, data)
    f = K.function(q.inputs, q.outputs)
    got = f([data])
    labels = _labels(f)
    assert labels[0] == 'gather'
    assert ('(uint8 in)' in ' '.join(labels)) != also_float, labels
    with monkeypatch.context() as m:
        m.setattr(qops._Quantized, 'chaining', False)
        want = K.function(q.inputs, q.outputs)([data])
    for g, w in zip(got, want):
        assert g.tobytes() == w.tobytes()
