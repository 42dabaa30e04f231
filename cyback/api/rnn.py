"""Symbolic loops of the Keras backend API: rnn, map_fn, foldl, foldr."""
from cyback import config
from cyback.graph import calls as _calls
from cyback.graph import collector
from cyback.graph.function import leaves_of
from cyback.graph.tensor import Tensor, as_tensor
from cyback.ops import elementwise as ew
from cyback.ops import shape as shp
from cyback.ops.scan import build_scan

__all__ = ["rnn", "map_fn", "foldl", "foldr"]


def _flatten(structure):
    if isinstance(structure, (list, tuple)):
        flat = []
        for s in structure:
            flat.extend(_flatten(s))
        return flat
    return [structure]


def _pack(structure, flat):
    """Rebuild ``structure``'s nesting from the flat list ``flat``."""
    it = iter(flat)

    def build(s):
        if isinstance(s, (list, tuple)):
            return type(s)(build(x) for x in s) if isinstance(s, tuple) else [build(x) for x in s]
        return next(it)
    return build(structure)


def _time_first(x):
    return shp.transpose(x, (1, 0) + tuple(range(2, x.ndim)))


def _expand_to(m, ndim):
    """A (B,) bool mask as (B, 1, ..., 1) of rank ``ndim``."""
    if m.ndim >= ndim:
        return m
    return shp.reshape_static_dims(m, tuple(range(m.ndim, ndim)), ndim)


def _stack_steps(steps):
    return shp.concatenate([shp.reshape_static_dims(s, (0,), s.ndim + 1) for s in steps], 0)


def _reads_learning_phase(tensors):
    """Whether the symbolic learning phase is among the leaves of ``tensors``
    (the step may read it without marking its outputs, as TF's rnn allows)."""
    phase = config.learning_phase_placeholder(create=False)
    if phase is None:       # no graph reads what does not exist yet
        return False
    return any(x is phase for x in leaves_of([t for t in tensors if isinstance(t, Tensor)]))


def rnn(step_function, inputs, initial_states, go_backwards=False, mask=None, constants=None,
        unroll=False, input_length=None, time_major=False, zero_output_for_mask=False):
    """Iterate ``step_function(input_t, states + constants) -> (output_t, new_states)``
    over the time axis of ``inputs``.

    Returns ``(last_output, outputs, new_states)``; outputs are (batch, time, ...)
    unless ``time_major``. With a (batch, time) ``mask``, masked steps keep the
    previous states and output (or give zeros if ``zero_output_for_mask``).
    Not unrolled, the step is traced once and runs as a compiled loop whose
    gradient is backprop through time.
    """
    if not callable(step_function):
        raise TypeError("rnn: step_function must be callable, got %r" % (step_function,))
    nested_inputs = isinstance(inputs, (list, tuple))
    flat_inputs = [as_tensor(t) for t in _flatten(inputs)]
    if not flat_inputs:
        raise ValueError("rnn: inputs is an empty structure")
    for t in flat_inputs:
        if t.ndim < 3:
            raise ValueError("rnn: inputs must have rank >= 3 (%s, ...), got shape %s"
                             % ("time, batch" if time_major else "batch, time", t.shape))
    structure = initial_states if initial_states is not None else []
    flat_init = [as_tensor(s) for s in _flatten(structure)]
    if constants is None:
        constants = []
    elif not isinstance(constants, (list, tuple)):
        constants = [constants]
    constants = list(constants)
    n_states = len(flat_init)

    xs = flat_inputs if time_major else [_time_first(t) for t in flat_inputs]
    known = sorted({t.shape[0] for t in xs if t.shape[0] is not None})
    if len(known) > 1:
        raise ValueError("rnn: the inputs have different numbers of time steps %s (shapes %s)"
                         % (known, [t.shape for t in flat_inputs]))
    n_steps = known[0] if known else None
    if n_steps == 0:
        raise ValueError("rnn: the inputs have 0 time steps (shape %s), so there is no last "
                         "output" % (flat_inputs[0].shape,))
    m = None
    if mask is not None:
        m = as_tensor(mask)
        if m.ndim == 3 and m.shape[2] in (1, None):
            m = shp.reshape_static_dims(shp.getitem(m, (slice(None), slice(None), 0)), (), 2)
        if m.ndim != 2:
            raise ValueError("rnn: mask must have shape (samples, time) or (samples, time, 1), "
                             "got %s" % (m.shape,))
        m = ew.cast(m, "bool")
        if not time_major:
            m = shp.transpose(m, (1, 0))
        if m.shape[0] is not None and n_steps is not None and m.shape[0] != n_steps:
            raise ValueError("rnn: mask has %d time steps, inputs have %d (mask shape %s, "
                             "inputs %s)" % (m.shape[0], n_steps, tuple(mask.shape)
                                             if hasattr(mask, "shape") else None,
                                             flat_inputs[0].shape))
    if go_backwards:
        xs = [shp.getitem(x, slice(None, None, -1)) for x in xs]
        if m is not None:
            m = shp.getitem(m, slice(None, None, -1))

    traced_learning_phase = []

    def call_step(x_slices, states):
        x_t = _pack(inputs, x_slices) if nested_inputs else x_slices[0]
        packed = _pack(structure, states)
        packed = list(packed) if isinstance(structure, (list, tuple)) else [packed]
        out, new = step_function(x_t, packed + constants)
        new = [as_tensor(s) for s in _flatten(new if new is not None else [])]
        if any(getattr(t, "_uses_learning_phase", False) for t in [out] + new):
            traced_learning_phase.append(True)
        if len(new) != n_states:
            raise ValueError("rnn: step_function returned %d states, expected %d"
                             % (len(new), n_states))
        for s_old, s_new in zip(states, new):
            if s_new.ndim != s_old.ndim:
                raise ValueError("rnn: step_function returned a state of rank %d for a state "
                                 "of shape %s (rank %d)" % (s_new.ndim, s_old.shape, s_old.ndim))
        return as_tensor(out), new

    def masked(m_t, out, new, states, prev_out):
        keep = _expand_to(m_t, out.ndim)
        out = ew.where(keep, out, ew.zeros_like_tensor(out) if zero_output_for_mask else prev_out)
        new = [ew.where(_expand_to(m_t, s.ndim), n, s) for n, s in zip(new, states)]
        return out, new

    trial = None
    if m is not None or not unroll:
        # One call outside the loop, as TensorFlow's rnn makes: a cell that
        # draws its dropout masks on its first call (Keras 2.3's cells, from
        # ones_like of the step's input and state) then draws them here, once
        # per sequence, and the loop reuses them at every step. Traced inside
        # the loop they would be drawn anew at each step.
        trial, _ = call_step([shp.getitem(x, 0) for x in xs], flat_init)
    if m is not None:
        # The output of a masked step repeats the last one, so the loop
        # carries it as one more state, starting from zeros.
        if all(d is not None for d in trial.shape[1:]):
            batch = shp.getitem(shp.shape_of(xs[0]), 1)
            zeros_out = shp.fill("rnn", [batch] + list(trial.shape[1:]), 0, trial.dtype)
        else:
            zeros_out = ew.zeros_like_tensor(trial)

    if unroll:
        steps = n_steps
        if steps is None:
            raise ValueError("rnn: unroll=True needs a known number of time steps, inputs have "
                             "shape %s" % (flat_inputs[0].shape,))
        if steps == 0:
            raise ValueError("rnn: unroll=True needs at least one time step, inputs have "
                             "shape %s" % (flat_inputs[0].shape,))
        states, outputs = flat_init, []
        prev = zeros_out if m is not None else None
        # a whole graph is built here: see graph/collector.py
        with collector.paused():
            for t in range(steps):
                out, new = call_step([shp.getitem(x, t) for x in xs], states)
                if m is not None:
                    out, new = masked(shp.getitem(m, t), out, new, states, prev)
                    prev = out
                outputs.append(out)
                states = new
            outputs_tm = _stack_steps(outputs)
        last = outputs[-1]
        final = states
    else:
        def step(slices, states):
            cur = states[:n_states]
            out, new = call_step(slices[:len(xs)], cur)
            if m is not None:
                out, new = masked(slices[-1], out, new, cur, states[n_states])
                return [out], new + [out]
            return [out], new

        seqs = xs + ([m] if m is not None else [])
        init = flat_init + ([zeros_out] if m is not None else [])
        (outputs_tm,), final = build_scan(step, seqs, init, name="rnn")
        final = final[:n_states]
        last = shp.end_of(outputs_tm, -1, "rnn", "the inputs have 0 time steps, so there is "
                          "no last output")
    outputs = outputs_tm if time_major else _time_first(outputs_tm)
    new_states = _pack(structure, final) if isinstance(structure, (list, tuple)) else final
    results = [last, outputs] + list(_flatten(new_states))
    if (traced_learning_phase or any(getattr(x, "_uses_learning_phase", False)
                                     for x in flat_inputs + flat_init + constants)
            or _reads_learning_phase(results)):
        # Keras feeds the learning phase only to models whose outputs say they
        # use it; a step with dropout must say so or fit runs it in test mode.
        for t in results:
            if isinstance(t, Tensor):
                t._uses_learning_phase = True
    return last, outputs, list(new_states) if isinstance(new_states, tuple) else new_states


def map_fn(fn, elems, name=None, dtype=None):
    """``fn`` applied to each slice of ``elems`` along axis 0, stacked.

    ``fn`` may return a tensor or a list/tuple of tensors (then ``dtype``, if
    given, is a matching list of dtypes); the result has the same structure.
    """
    if not callable(fn):
        raise TypeError("map_fn: fn must be callable, got %r" % (fn,))
    elems = as_tensor(elems)
    if elems.ndim < 1:
        raise ValueError("map_fn: elems must have rank >= 1, got a scalar")
    structure = []

    def step(slices, states):
        out = fn(slices[0])
        structure.append(out)
        flat = [as_tensor(o) for o in _flatten(out)]
        if dtype is not None:
            dtypes = _flatten(dtype) if isinstance(dtype, (list, tuple)) else [dtype] * len(flat)
            if len(dtypes) != len(flat):
                raise ValueError("map_fn: dtype %r does not match the %d outputs of fn"
                                 % (dtype, len(flat)))
            flat = [ew.cast(o, d) for o, d in zip(flat, dtypes)]
        return flat, []

    outs, _ = build_scan(step, [elems], [], name=name or "map_fn")
    return _pack(structure[0], outs) if isinstance(structure[0], (list, tuple)) else outs[0]


def _fold(api, fn, elems, initializer, reverse):
    if not callable(fn):
        raise TypeError("%s: fn must be callable, got %r" % (api, fn))
    elems = as_tensor(elems)
    if elems.ndim < 1:
        raise ValueError("%s: elems must have rank >= 1, got a scalar" % api)
    if reverse:
        elems = shp.getitem(elems, slice(None, None, -1))
    if initializer is None:
        if elems.shape[0] == 0:
            raise ValueError("%s: elems is empty and no initializer was given" % api)
        initializer = shp.end_of(elems, 0, api, "elems is empty and no initializer was given")
        elems = shp.getitem(elems, slice(1, None))
    init = as_tensor(initializer) if isinstance(initializer, Tensor) else \
        ew.weak(initializer, elems.dtype)

    def step(slices, states):
        return [], [as_tensor(fn(states[0], slices[0]))]

    _, (acc,) = build_scan(step, [elems], [init], name=api)
    return acc


def foldl(fn, elems, initializer=None, name=None):
    """Reduce ``elems`` along axis 0 from the left: ``acc = fn(acc, x)``."""
    return _fold(name or "foldl", fn, elems, initializer, reverse=False)


def foldr(fn, elems, initializer=None, name=None):
    """Reduce ``elems`` along axis 0 from the right: ``acc = fn(acc, x)``."""
    return _fold(name or "foldr", fn, elems, initializer, reverse=True)


# errors escaping each function name it; nodes remember it (graph/calls.py)
_calls.name_functions(globals(), __all__)
