"""The Op interface.

An op subclass keeps its parameters as attributes (set in ``__init__``) and
defines its rules side by side:

- ``infer(*inputs)``: the static shape and dtype of each output, as a list of
  ``(shape, dtype)``; validates arguments and raises ValueError naming the
  Keras function (``self.api``), the argument and the shapes.
- ``compute(*arrays)``: NumPy arrays in, a tuple of arrays out (one per
  output). Must not modify its inputs.
- ``grad(inputs, outputs, output_grads)``: one symbolic gradient (or None) per
  input, written with ops so that gradients of gradients work.
  ``output_grads`` has None for outputs that got no gradient.

Optional hooks tell the compiler what it may do with the op; a pass never
tests for op classes, it asks the op (JAX registers rules per primitive the
same way). Plans (``graph/function.py``, ``graph/optimize.py``):

- ``simplify(inputs)``: replacement outputs when the inputs make the op
  trivial (a switch on a known condition), or None.
- ``key()``: the op's identity for common-subexpression elimination.
- ``compute_for(needed)``: the compute to use in a plan that reads only the
  outputs flagged in ``needed`` (a Scan's records for its gradient).
- ``rewrite(inputs, ctx)``: replacement outputs in an inference plan, or None
  (``Binary('multiply')`` folds a per-channel weight scale into the op
  before it).
- ``lower(inputs, ctx)``: the same, in a second walk of an inference plan
  after every ``rewrite``: the op replaced by one that runs on a layout of
  its weights made once (TensorDot and Conv by PackedProduct and
  PackedConv), after the rewrites that recognise the op by its class.
- ``scale_output(inputs, out, v, ctx)``: ``out * v`` for a per-channel weight
  vector ``v``, computed by this op with scaled weights, or None (conv,
  depthwise, dense: BatchNorm folding).
- ``ewise(builder, *registers)``: the op's element-wise computation emitted
  into a ``graph.fusion.ProgramBuilder`` (returns the result register), or
  None: the op may join a fused element-wise step.
- ``fresh_output`` / ``epilogue_host`` (class flags): compute returns a new
  array, so a fused step may write into it / run the op and its element-wise
  tail as one step.
- ``kernel_epilogue(bias_axis, activation, out, residual=False, exact=False)``
  and ``compute_epilogue(inputs, bias, activation, residual=None)``: whether
  the op's kernel applies a tail of + per-channel bias, + a full-size residual
  and relu / relu6 to its output itself (with ``exact``, a training plan's
  fusion: only with results bit-identical to the ops run one by one), and
  the compute that does it (None when the run-time arrays do not suit it;
  the step then runs its program). Conv and depthwise add after the sum, as
  the ops do; TensorDot's bias is its GEMM's initial value, and a product of
  a few rows applies relu / relu6 too, so it declines exact fusion.
- ``bind(arrays)``: for an inference plan's later calls on arrays of the
  shapes of ``arrays`` (the step's inputs a run just computed from): ``(call,
  positions, listed)``, where ``call`` taking the inputs at ``positions``
  (None passes None), as a list if ``listed``, returns what compute's one
  output would be, through the same kernel (the same bits), or None when
  the arrays it gets do not fit (the step then runs compute). None when the
  op has no such call. The call must check what memory safety needs itself
  and keep no array: a bound plan (graph/binding.py) hands it whatever a
  later call brings. ``bind_epilogue(inputs, bias, activation, residual)``
  is the same for ``compute_epilogue`` (a fused step's base op), positions
  past the inputs being the bias and the residual.

Loops (``ops/scan.py``: ``scan_trace``, ``scan_program``, ``scan_backward``):

- ``time_mapped(inputs, variant)``: the op computing this one for all steps
  at once on time-major stacks of its ``variant`` inputs, or None (hoisting
  ``x_t @ W`` out of an RNN loop).
- ``inline_src(inputs, outputs, ns, args)``: ``(source, multiply-adds, takes
  out=)`` for a direct NumPy call inside a generated loop, or None. Where the
  class also sets ``inline_in_plan = True``, the source gives exactly what
  ``compute`` returns (for results of one or more dimensions), and a compiled
  function's plan runs it in place of the call (graph/function.py): views
  and fills at batch 1 cost more in the call than in NumPy.
- ``shape_only_inputs`` (class tuple): inputs read only for their shape, so
  a reverse loop needs no per-step record of them.
- ``addends(inputs)``: the terms the op adds up (``Binary('add')``), or None:
  sums are regrouped so that their loop-invariant part is hoisted, and split
  into terms whose sum over steps is taken after the loop.
- ``steps_summed(inputs)`` and ``sum_over_steps(stacked, like, sum_steps)``:
  which inputs to record per step, and the op that sums this op's output over
  all steps from their (T, ...) stacks (``TensorDot``: one product over time
  and the contracted axes; ``SumToShape``: ``sum_steps(stack)``, the loop's
  sum of a stack over its steps, then to its shape), or None.
- ``static_scatter(inputs)``: ``(g, like, index)`` when the op is
  ``zeros_like(like)`` with ``g`` added at a static ``index``
  (``ScatterAdd``): a loop adds several such slices into one buffer.

Applying an op (``op(x, y)``) builds a Node; when every input is a Constant the
op is computed at once and its outputs are Constants (eager folding), unless
they would be large (``graph/limits.py``: such results are computed when a
function runs). An output whose static shape no array could have is refused
with a ValueError naming the op.
"""
import numpy as np

from cyback.graph import limits
from cyback.graph.tensor import Constant, Node, Tensor, as_tensor, np_dtype_name

#: Stack of {variable: assign tensor} maps, one per active
#: ``control_dependencies`` block: inside it, ops read a variable's value after
#: the listed updates, as TensorFlow orders them.
_after_updates = []


def push_after_updates(assigned):
    """Enter a ``control_dependencies`` block: until ``pop_after_updates``, an
    op given variable ``v`` reads ``assigned[v]`` (the tensor that updates it)
    instead, besides what enclosing blocks already map."""
    mapping = dict(_after_updates[-1]) if _after_updates else {}
    mapping.update(assigned)
    _after_updates.append(mapping)


def pop_after_updates():
    """Leave the innermost ``control_dependencies`` block."""
    _after_updates.pop()


class Op(object):
    #: the Keras function name used in error messages
    api = None
    #: False for ops whose result changes between runs (random) or that have
    #: side effects (print): never folded, never merged by CSE
    pure = True
    #: number of outputs
    n_outputs = 1

    def infer(self, *inputs):
        raise NotImplementedError

    def compute(self, *arrays):
        raise NotImplementedError

    def grad(self, inputs, outputs, output_grads):
        return [None] * len(inputs)

    # ------------------------------------------------------------------

    def key(self):
        """Hashable identity of the op and its parameters, for CSE."""
        if not self.pure:
            return None
        try:
            items = tuple(sorted((k, _freeze(v)) for k, v in vars(self).items()))
            hash(items)
        except TypeError:
            return None
        return (type(self), items)

    def __call__(self, *inputs, name=None):
        inputs = [as_tensor(x) for x in inputs]
        if _after_updates:
            inputs = [_after_updates[-1].get(x, x) for x in inputs]
        specs = self.infer(*inputs)
        for shape, dtype in specs:
            limits.check_shape(self.api or type(self).__name__, shape, dtype)
        if self.pure and all(type(x) is Constant for x in inputs) and \
                all(limits.foldable(shape, dtype) for shape, dtype in specs):
            values = self.compute(*[x.value for x in inputs])
            outs = [Constant(_as_dtype(v, d)) for v, (_, d) in zip(values, specs)]
        else:
            node = Node(self, inputs)
            outs = [Tensor(node, i, shape, dtype, name) for i, (shape, dtype) in enumerate(specs)]
            node.outputs = outs
            if any(getattr(x, "_uses_learning_phase", False) for x in inputs):
                for o in outs:
                    o._uses_learning_phase = True
        return outs[0] if self.n_outputs == 1 else tuple(outs)

    def __repr__(self):
        params = ", ".join("%s=%r" % kv for kv in sorted(vars(self).items()))
        return "%s(%s)" % (type(self).__name__, params)


def _freeze(v):
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, np.ndarray):
        return (v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    return v


def _as_dtype(value, dtype):
    """A folded value in the dtype its op inferred."""
    value = np.asarray(value)
    if np_dtype_name(value.dtype) != dtype:
        value = value.astype(dtype)
    return value
