"""The same inputs give bit-identical outputs on every call at one thread
setting, whatever the thread team's state (asleep or awake, the host busy or
not): a kernel splits its work by the setting and the shapes, and the team's
state only decides how many threads run the pieces.

The in-process tests force the team's size (runtime.force_team_threads); the
subprocess tests run at the default cutoff, where the policy of
include/cyback_team.h picks one thread or the team from the timing of the
calls."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import cyback as K
from cyback.kernels import runtime


@pytest.fixture
def two_threads():
    saved = K.get_num_threads()
    K.set_num_threads(2)
    yield
    K.set_num_threads(saved)
    runtime.force_team_threads(None)


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype("float32")


def _graph(name, rng):
    """(placeholders, feeds, outputs) of one case: the op and, where it has
    one, its gradient."""
    feeds = []

    def ph(a):
        p = K.placeholder(shape=a.shape, dtype=str(a.dtype))
        feeds.append((p, a))
        return p

    x4 = _f32(rng, 5, 13, 11, 12)
    cases = {
        "dot": lambda: K.dot(ph(_f32(rng, 48, 300)), ph(_f32(rng, 300, 70))),
        "dot_one_row": lambda: K.dot(ph(_f32(rng, 1, 300)), ph(_f32(rng, 300, 700))),
        "dot_odd": lambda: K.dot(ph(_f32(rng, 7, 33)), ph(_f32(rng, 33, 1))),
        "batch_dot": lambda: K.batch_dot(ph(_f32(rng, 2, 200, 150)), ph(_f32(rng, 2, 150, 90)),
                                         axes=(2, 1)),
        "conv2d": lambda: K.conv2d(ph(x4), ph(_f32(rng, 3, 3, 12, 20)), padding="same"),
        "conv2d_strided": lambda: K.conv2d(ph(x4), ph(_f32(rng, 3, 3, 12, 8)), strides=(2, 2)),
        "conv2d_1x1": lambda: K.conv2d(ph(x4), ph(_f32(rng, 1, 1, 12, 40))),
        "conv2d_channels_first": lambda: K.conv2d(
            ph(np.ascontiguousarray(x4.transpose(0, 3, 1, 2))), ph(_f32(rng, 3, 3, 12, 6)),
            data_format="channels_first"),
        "conv1d": lambda: K.conv1d(ph(_f32(rng, 4, 33, 12)), ph(_f32(rng, 5, 12, 16))),
        "conv3d": lambda: K.conv3d(ph(_f32(rng, 2, 7, 9, 8, 6)), ph(_f32(rng, 3, 3, 3, 6, 8))),
        "conv2d_transpose": lambda: K.conv2d_transpose(
            ph(x4), ph(_f32(rng, 3, 3, 7, 12)), (5, 27, 23, 7), strides=(2, 2)),
        "depthwise": lambda: K.depthwise_conv2d(ph(x4), ph(_f32(rng, 3, 3, 12, 2)),
                                                padding="same"),
        "separable": lambda: K.separable_conv2d(ph(x4), ph(_f32(rng, 3, 3, 12, 1)),
                                                ph(_f32(rng, 1, 1, 12, 24)), padding="same"),
        "max_pool": lambda: K.pool2d(ph(x4), (3, 3), (2, 2)),
        "avg_pool": lambda: K.pool2d(ph(x4), (3, 3), (1, 1), padding="same", pool_mode="avg"),
        "sum": lambda: K.sum(ph(_f32(rng, 300, 500)), axis=0),
        "mean_all": lambda: K.mean(ph(_f32(rng, 900, 500))),
        "var": lambda: K.var(ph(_f32(rng, 300, 500)), axis=1),
        "softmax": lambda: K.softmax(ph(_f32(rng, 300, 500))),
        "local_conv2d": lambda: K.local_conv2d(ph(_f32(rng, 4, 6, 6, 3)),
                                               ph(_f32(rng, 16, 27, 5)), (3, 3), (1, 1),
                                               (4, 4), "channels_last"),
    }
    out = cases[name]()
    loss = K.sum(K.square(out))
    grads = K.gradients(loss, [p for p, _ in feeds])
    return [p for p, _ in feeds], [a for _, a in feeds], [out] + list(grads)


CASES = ["dot", "dot_one_row", "dot_odd", "batch_dot", "conv2d", "conv2d_strided", "conv2d_1x1",
         "conv2d_channels_first", "conv1d", "conv3d", "conv2d_transpose", "depthwise",
         "separable", "max_pool", "avg_pool", "sum", "mean_all", "var", "softmax",
         "local_conv2d"]


@pytest.mark.parametrize("name", CASES)
def test_same_result_whatever_the_team_runs_on(name, two_threads):
    inputs, values, outputs = _graph(name, np.random.default_rng(7))
    f = K.function(inputs, outputs)
    results = []
    for forced in (1, 2, None, 1):
        runtime.force_team_threads(forced)
        results.append(f(values))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


def test_recurrent_layers_same_result_whatever_the_team_runs_on(two_threads):
    rng = np.random.default_rng(3)
    x = K.placeholder(shape=(8, 12, 10))
    k = K.variable(_f32(rng, 10, 4 * 40))
    r = K.variable(_f32(rng, 40, 4 * 40) * 0.1)
    h0 = K.zeros((8, 40))

    def step(inp, states):
        z = K.dot(inp, k) + K.dot(states[0], r)
        i, f, c, o = (z[:, j * 40:(j + 1) * 40] for j in range(4))
        c = K.sigmoid(f) * states[1] + K.sigmoid(i) * K.tanh(c)
        h = K.sigmoid(o) * K.tanh(c)
        return h, [h, c]

    last, seq, _ = K.rnn(step, x, [h0, h0])
    loss = K.sum(K.square(seq))
    f = K.function([x], [seq] + K.gradients(loss, [x, k, r]))
    xv = _f32(rng, 8, 12, 10)
    results = []
    for forced in (1, 2, None):
        runtime.force_team_threads(forced)
        results.append(f([xv]))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


def test_force_team_threads_checks_its_argument():
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="force_team_threads"):
            runtime.force_team_threads(bad)


_DEFAULT_CUTOFF_PROBE = r"""
import json, sys
import numpy as np
import cyback as K
from cyback.kernels import runtime, linalg

rng = np.random.default_rng(0)
# medium products: above a quarter of the default cutoff, below the cutoff,
# so the team takes them only while it is awake or the run of ops is dense
a = rng.standard_normal((32, 256)).astype("float32")
b = rng.standard_normal((256, 200)).astype("float32")
bias = rng.standard_normal(200).astype("float32")
big = rng.standard_normal((512, 512)).astype("float32")
x = K.placeholder(shape=(32, 256))
f = K.function([x], [K.bias_add(K.dot(x, K.constant(b)), K.constant(bias))])
results = {}
runtime.team_rest()
results["cold"] = [linalg.matmul(a, b, bias), f([a])[0]]
linalg.matmul(big, big)              # wakes the team: the next ops find it warm
results["warm"] = [linalg.matmul(a, b, bias), f([a])[0]]
runtime.force_host_busy(True)
results["busy"] = [linalg.matmul(a, b, bias), f([a])[0]]
runtime.force_host_busy(None)
ref = results["cold"]
print(json.dumps({k: [bool(np.array_equal(r, o)) for r, o in zip(ref, v)]
                  for k, v in results.items()}))
"""


def test_same_result_cold_warm_and_busy_at_the_default_cutoff():
    env = {k: v for k, v in os.environ.items()
           if k not in ("CYBACK_PARALLEL_MIN_WORK", "CYBACK_TEAM_WARM_US")}
    env["CYBACK_NUM_THREADS"] = "2"
    out = subprocess.run([sys.executable, "-c", _DEFAULT_CUTOFF_PROBE], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    same = json.loads(out.stdout.strip().splitlines()[-1])
    assert same == {"cold": [True, True], "warm": [True, True], "busy": [True, True]}
