"""Keras LSTM, GRU and SimpleRNN layers on the fused recurrent cell and on
the general Scan give the same predictions and gradients."""
import keras
import numpy as np
import pytest

import cyback as K
from cyback.graph.function import topo_nodes
from cyback.ops import scan_cells
from cyback.ops.rnn_cell import FusedRecurrent
from cyback.ops.scan import Scan

L = keras.layers


def _model(kind, fused, masking, kw, batch=None):
    scan_cells.ENABLED = fused
    try:
        if kw.get("stateful"):
            inp = L.Input(batch_shape=(batch, 5, 3))
        else:
            inp = L.Input((5, 3))
        x = L.Masking(0.0)(inp) if masking else inp
        y = _layer(kind, **kw)(x)
        model = keras.models.Model(inp, y)
    finally:
        scan_cells.ENABLED = True
    return model


def _layer(kind, *args, **kw):
    """A layer of 4 units: "GRU_ra" is a GRU with the reset gate after its
    product (reset_after, the layout of CuDNN and tf.keras 2); "_impl1" takes
    Keras's implementation 1 (one product per gate, Keras 2.2's default) with
    its hard_sigmoid gates."""
    if kind.endswith("_impl1"):
        kind = kind[:-len("_impl1")]
        kw = dict(kw, implementation=1, recurrent_activation="hard_sigmoid")
    if kind == "GRU_ra":
        return L.GRU(4, *args, reset_after=True, **kw)
    return getattr(L, kind)(4, *args, **kw)


KINDS = ["LSTM", "SimpleRNN", "GRU", "GRU_ra", "LSTM_impl1", "GRU_impl1", "GRU_ra_impl1"]


def _loss_and_grads(model):
    loss = K.sum(model.output * model.output)
    grads = K.gradients(loss, model.trainable_weights + [model.input])
    return K.function([model.input, K.learning_phase()], [model.output] + grads)


def _data(seed=0):
    rs = np.random.RandomState(seed)
    x = rs.randn(3, 5, 3).astype("float32")
    x[0, 3:] = 0.0     # masked tail
    x[2, 1] = 0.0      # a masked step in the middle
    return x


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("masking,kw", [
    (False, {}),
    (True, dict(return_sequences=True)),
    (True, dict(go_backwards=True, return_sequences=True)),
    (True, dict(stateful=True, return_sequences=True)),
])
def test_fused_layer_matches_general_scan(kind, masking, kw):
    x = _data()
    fused = _model(kind, True, masking, kw, batch=len(x))
    general = _model(kind, False, masking, kw, batch=len(x))
    general.set_weights(fused.get_weights())
    ops_f = [type(n.op) for n in topo_nodes([fused.output])]
    ops_g = [type(n.op) for n in topo_nodes([general.output])]
    assert FusedRecurrent in ops_f and Scan not in ops_f
    assert Scan in ops_g and FusedRecurrent not in ops_g
    got = _loss_and_grads(fused)([x, 0])
    want = _loss_and_grads(general)([x, 0])
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)
    if kw.get("stateful"):
        # The carried state is the same on both paths: a second call agrees.
        np.testing.assert_allclose(fused.predict(x, batch_size=len(x)),
                                   general.predict(x, batch_size=len(x)), rtol=2e-4, atol=2e-5)
        np.testing.assert_allclose(fused.predict(x, batch_size=len(x)),
                                   general.predict(x, batch_size=len(x)), rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("masking", [False, True])
def test_layer_dropout(kind, masking):
    # Keras 2.3 draws its dropout masks inside the step, on the cell's first
    # call (from ones_like of the step's input and state). rnn makes that
    # first call outside the loop, so the masks are loop invariants and the
    # cell is fused, with or without a Keras mask. Implementation 1 draws one
    # recurrent mask per gate, so that its gates multiply different h: those
    # stay on the general Scan.
    kw = dict(dropout=0.2, recurrent_dropout=0.3, return_sequences=True)
    model = _model(kind, True, masking, kw)
    ops = [type(n.op) for n in topo_nodes([model.output])]
    fused = not kind.endswith("_impl1")
    assert (FusedRecurrent in ops) == fused and (Scan in ops) != fused
    general = _model(kind, False, masking, kw)
    general.set_weights(model.get_weights())
    x = _data()
    got = _loss_and_grads(model)([x, 0])
    want = _loss_and_grads(general)([x, 0])
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)
    # In training, the fused cell applies a recurrent dropout mask: the
    # output differs from the inference output, and it is finite.
    train_out = _loss_and_grads(model)([x, 1])[0]
    assert np.all(np.isfinite(train_out)) and not np.allclose(train_out, got[0])


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("kind", ["SimpleRNN", "GRU", "GRU_ra"])
def test_recurrent_dropout_mask_is_fixed_over_the_sequence(kind, fused):
    # Recurrent dropout drops the same units of h at every step of a sequence
    # (one mask per sequence, as Keras on TensorFlow draws it), not a new
    # mask per step. An impulse at step 0 through an identity recurrence with
    # no bias keeps a unit's state nonzero at every later step, or zero at
    # every later step when the mask drops it (tanh(0) = 0; Keras's GRU mixes
    # the dropped h_{t-1} into its new state).
    units, steps = 256, 4
    scan_cells.ENABLED = fused
    try:
        inp = L.Input((steps, 1))
        cls = L.GRU if kind.startswith("GRU") else getattr(L, kind)
        layer = cls(units, recurrent_dropout=0.5, return_sequences=True, use_bias=False,
                    **(dict(reset_after=True) if kind == "GRU_ra" else {}))
        model = keras.models.Model(inp, layer(inp))
    finally:
        scan_cells.ENABLED = True
    ops = [type(n.op) for n in topo_nodes([model.output])]
    assert (FusedRecurrent in ops) == fused
    kernel, rec = layer.get_weights()
    layer.set_weights([np.ones_like(kernel),
                       np.tile(np.eye(units, dtype=rec.dtype), (1, rec.shape[1] // units))])
    x = np.zeros((2, steps, 1), "float32")
    x[:, 0] = 1.0
    out = K.function([model.input, K.learning_phase()], [model.output])([x, 1])[0]
    alive = out[:, 1:] != 0
    assert alive.any(axis=2).all() and not alive.all()
    for t in range(1, alive.shape[1]):
        np.testing.assert_array_equal(alive[:, t], alive[:, 0])
    # In inference no unit is dropped.
    assert np.all(K.function([model.input, K.learning_phase()], [model.output])([x, 0])[0]
                  [:, 1:] != 0)


def test_lstm_trains_on_the_fused_cell():
    rs = np.random.RandomState(1)
    x = rs.randn(64, 5, 3).astype("float32")
    y = (x.sum(axis=(1, 2)) > 0).astype("float32")
    model = keras.models.Sequential([L.LSTM(8, input_shape=(5, 3)),
                                     L.Dense(1, activation="sigmoid")])
    model.compile("adam", "binary_crossentropy")
    before = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=15, batch_size=16, verbose=0)
    assert model.evaluate(x, y, verbose=0) < before
