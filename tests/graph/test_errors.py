"""Errors raised inside a compiled function keep their chain: the re-raised
error names the op, its __cause__ is the original error with the traceback
into the op's compute, and the plan's source is in linecache so the traceback
shows the plan line (with the op's name)."""
import linecache
import traceback

import numpy as np
import pytest

import cyback as K
from cyback.graph.op import Op


def _failing_lookup():
    idx = K.placeholder((None,), dtype="int32", name="idx")
    table = K.variable(np.ones((3, 2)))
    return K.function([idx], [K.gather(table, idx) * 2], name="lookup")


def test_error_keeps_the_chain_and_names_the_op():
    f = _failing_lookup()
    with pytest.raises(ValueError) as info:
        f([np.array([5], np.int32)])
    e = info.value
    assert "(while running gather)" in str(e)
    assert isinstance(e.__cause__, ValueError) and "while running" not in str(e.__cause__)
    frames = traceback.extract_tb(e.__cause__.__traceback__)
    names = [(fr.filename, fr.name) for fr in frames]
    assert any(fn.startswith("<cyback function lookup #") and name == "run"
               for fn, name in names)
    assert names[-1][1] == "compute" and names[-1][0].endswith("manip.py")


def test_traceback_shows_the_plan_line():
    f = _failing_lookup()
    with pytest.raises(ValueError) as info:
        f([np.array([7], np.int32)])
    text = "".join(traceback.format_exception(type(info.value), info.value,
                                              info.value.__traceback__))
    assert "The above exception was the direct cause" in text
    plan_frame = [fr for fr in traceback.extract_tb(info.value.__cause__.__traceback__)
                  if fr.filename.startswith("<cyback function")][0]
    assert "# gather (Gather)" in plan_frame.line
    assert plan_frame.line in text
    assert linecache.getline(plan_frame.filename, plan_frame.lineno).strip() == plan_frame.line


def test_each_plan_has_its_own_source_name():
    f, g = _failing_lookup(), _failing_lookup()
    names = set()
    for fn in (f, g):
        with pytest.raises(ValueError) as info:
            fn([np.array([9], np.int32)])
        names.update(fr.filename for fr in traceback.extract_tb(info.value.__cause__.__traceback__)
                     if fr.filename.startswith("<cyback"))
    assert len(names) == 2


class _Weird(Exception):
    def __init__(self, a, b):
        super().__init__(a, b)


class _Raises(Op):
    api = "raises"

    def infer(self, x):
        return [(x.shape, x.dtype)]

    def compute(self, x):
        raise _Weird(1, 2)


def test_exception_types_that_cannot_be_rebuilt_pass_through():
    x = K.placeholder((2,))
    f = K.function([x], [_Raises()(x)])
    with pytest.raises(_Weird) as info:
        f([np.ones(2, "float32")])
    assert info.value.args == (1, 2)
    assert any(fr.name == "compute" for fr in traceback.extract_tb(info.value.__traceback__))


def test_feed_errors_are_unchanged():
    x = K.placeholder((None, 3), name="x")
    f = K.function([x], [x * 2], name="myfn")
    with pytest.raises(ValueError, match=r"^function 'myfn': placeholder 'x' expects shape"):
        f([np.ones((2, 4))])
