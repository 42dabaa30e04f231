"""Frozen weights: an inference plan computes its weight-only values once.

In a plan that assigns no variable, the steps that depend only on variables
and constants (a BatchNorm's scale and shift, a kernel scaled by it, a
transposed weight) are moved out of the per-call code into a ``Frozen``
prelude. Their results live in a box the plan's code unpacks on every call.

Variables carry a version that every assignment changes, and assignments
advance a global epoch (``tensor.weights_epoch``). A call compares the epoch
with the one its values were computed at — one comparison when nothing
changed — and otherwise refreshes: only the steps that depend on a variable
whose version changed are recomputed, so a plan never runs on stale weights.
"""
import threading

from cyback.graph import calls as _calls
from cyback.graph import tensor as _tensor
from cyback.graph.tensor import Constant, Variable


class Frozen(object):
    """The weight-only prelude of one plan.

    ``steps``: (op, inputs, outputs) computed from variables and constants;
    ``wanted``: the tensors (step outputs or variables) the plan reads, in the
    order of ``box[0]``.
    """

    def __init__(self, steps, wanted):
        self.steps = steps
        self.wanted = list(wanted)
        variables, seen = [], set()
        for _, ins, _ in steps:
            for x in ins:
                if isinstance(x, Variable) and id(x) not in seen:
                    seen.add(id(x))
                    variables.append(x)
        for x in self.wanted:
            if isinstance(x, Variable) and id(x) not in seen:
                seen.add(id(x))
                variables.append(x)
        self.variables = variables
        self.versions = [None] * len(variables)
        self.cache = {}
        self.box = [()]           # the values the plan unpacks
        self.epoch = [-1]         # the global epoch they were computed at
        self._lock = threading.Lock()
        self.refresh()

    def refresh(self):
        with self._lock:
            epoch = _tensor.weights_epoch()
            # versions before values: a value newer than its recorded version
            # only costs one more refresh
            versions = [v._version for v in self.variables]
            changed = {i for i, (a, b) in enumerate(zip(versions, self.versions)) if a != b}
            if changed or not self.cache and self.wanted:
                env = self.cache
                # the ids of the changed variables and of the values computed
                # again: a step reading one of them is computed again too
                dirty = set()
                for i in changed:
                    env[self.variables[i]] = self.variables[i]._value
                    dirty.add(self.variables[i].id)
                for op, ins, outs in self.steps:
                    if outs[0] in env and not any(x.id in dirty for x in ins):
                        continue
                    try:
                        values = op.compute(*[_value_of(x, env) for x in ins])
                    except (ValueError, TypeError) as e:
                        # name the backend function that built the op
                        node = outs[0].node
                        if node is not None and node.call is not None:
                            _calls.name_error(e, node.call)
                        raise
                    for o, v in zip(outs, values):
                        env[o] = v
                        dirty.add(o.id)
                self.box[0] = tuple(_value_of(t, env) for t in self.wanted)
                self.versions = versions
            self.epoch[0] = epoch


def _value_of(x, env):
    if type(x) is Constant:
        return x.value
    return env[x]
