"""cyback.dask: batch prediction over dask collections, on the synchronous
scheduler and on a LocalCluster of two worker processes (one thread each):
results equal local predictions; each worker loads the model once and runs
cyback on its share of the cores; a worker killed mid-job changes nothing;
bad chunks and bad arguments fail clearly."""
import os
import pickle
import pickletools
import re
import signal
import time

import numpy as np
import pytest

from keras_on_cyback import import_keras

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
pd = pytest.importorskip("pandas")
dd = pytest.importorskip("dask.dataframe")
cloudpickle = pytest.importorskip("cloudpickle")
# Keras on cyback whichever test module imports it first (an error, not a
# skip, if Keras was imported on another backend in this process).
keras = import_keras("tests/test_dask.py")
if keras is None:
    pytest.skip("multi-backend keras and h5py are not installed", allow_module_level=True)
from keras import layers  # noqa: E402

import cyback as K  # noqa: E402
import cyback.dask as cd  # noqa: E402
from cyback.dask import jobs, model, task_size  # noqa: E402

SYNC = {"scheduler": "synchronous"}


def _cnn(seed=0):
    np.random.seed(seed)
    return keras.Sequential([
        layers.Conv2D(4, 3, activation="relu", input_shape=(10, 10, 2)),
        layers.MaxPooling2D(),
        layers.Flatten(),
        layers.Dense(3, activation="softmax"),
    ])


@pytest.fixture(scope="module")
def cnn():
    return _cnn()


@pytest.fixture(scope="module")
def images():
    return np.random.RandomState(0).rand(90, 10, 10, 2).astype("float32")


def _mlp_function(n_in=4):
    rng = np.random.RandomState(3)
    x = K.placeholder((None, n_in), name="x")
    w = K.variable(rng.randn(n_in, 2), name="w")
    return x, K.function([x], [K.tanh(K.dot(x, w)), K.sum(x, axis=1)])


# ------------------------------------------------------ synchronous scheduler

def test_keras_model_over_numpy_matches_predict(cnn, images):
    pred = cd.predict(cnn, images, batch_size=8, chunk_rows=32)
    assert isinstance(pred, da.Array)
    assert pred.shape == (90, 3) and pred.dtype == np.float32
    assert pred.chunks == ((32, 32, 26), (3,))
    assert pred._meta.shape == (0, 0) and pred._meta.dtype == np.float32
    np.testing.assert_allclose(pred.compute(**SYNC), cnn.predict(images, batch_size=8),
                               rtol=1e-6, atol=1e-7)


def test_dask_array_chunks_kept_or_given_and_other_axes_joined(cnn, images):
    x = da.from_array(images, chunks=(25, 5, 10, 1))
    ref = cnn.predict(images)
    pred = cd.predict(cnn, x, batch_size=16, chunk_rows="keep")
    assert pred.chunks[0] == (25, 25, 25, 15)
    np.testing.assert_allclose(pred.compute(**SYNC), ref, rtol=1e-6, atol=1e-7)
    pred = cd.predict(cnn, x, batch_size=16, chunk_rows=40)       # rechunked to it
    assert pred.chunks[0] == (40, 40, 10)
    np.testing.assert_allclose(pred.compute(**SYNC), ref, rtol=1e-6, atol=1e-7)


def test_function_with_two_outputs_and_float64_data():
    x, f = _mlp_function()
    data = np.random.RandomState(4).rand(23, 4)           # float64, cast per chunk
    a, b = cd.predict(f, da.from_array(data, chunks=10), batch_size=4)
    assert (a.shape, b.shape, a.dtype) == ((23, 2), (23,), np.float32)
    got = dask.compute(a, b, **SYNC)
    for g, r in zip(got, f([data.astype("float32")])):
        np.testing.assert_allclose(g, r, rtol=1e-6)


def test_function_single_output_reading_the_learning_phase():
    x = K.placeholder((None, 3), name="x")
    f = K.function([x, K.learning_phase()], [K.in_train_phase(x * 2.0, x * 3.0)])
    data = np.ones((5, 3), "float32")
    pred = cd.predict(f, data, batch_size=2)
    np.testing.assert_array_equal(pred.compute(**SYNC), 3 * data)    # test phase


def test_open_output_sizes_are_learned_from_one_row():
    x = K.placeholder((None, None), name="x")
    f = K.function([x], [K.concatenate([x, x * 2.0], axis=1)])
    pred = cd.predict(f, np.ones((7, 3), "float32"), batch_size=4)
    assert pred.shape == (7, 6)
    np.testing.assert_array_equal(pred.compute(**SYNC)[:, 3:], 2)


def test_h5_path_and_npy_files_and_save(tmp_path, cnn, images):
    path = str(tmp_path / "cnn.h5")
    cnn.save(path)
    files = []
    for i, part in enumerate(np.array_split(images, 3)):
        files.append(str(tmp_path / ("x%d.npy" % i)))
        np.save(files[-1], part)
    ref = cnn.predict(images, batch_size=10)
    # Tasks read rows across file boundaries...
    pred = cd.predict(path, files, batch_size=10, chunk_rows=40)
    assert pred.chunks[0] == (40, 40, 10)
    np.testing.assert_allclose(pred.compute(**SYNC), ref, rtol=1e-6, atol=1e-7)
    # ... or one file each.
    pred = cd.predict(path, files, batch_size=10, chunk_rows="keep")
    assert pred.chunks[0] == (30, 30, 30)
    out = cd.save(pred, tmp_path / "out", compute=False)
    written = out.compute(**SYNC)
    assert [os.path.basename(p) for p in written] == ["part-00000.npy", "part-00001.npy",
                                                      "part-00002.npy"]
    back = cd.from_npy_files(written).compute(**SYNC)
    np.testing.assert_allclose(back, ref, rtol=1e-6, atol=1e-7)


def test_dataframe_columns_give_a_dataframe_with_its_index():
    x, _ = _mlp_function(3)
    w = K.variable(np.arange(6.0).reshape(3, 2))
    f = K.function([x], [K.dot(x, w)])
    frame = pd.DataFrame(np.random.RandomState(5).rand(17, 4), columns=list("abcd"),
                         index=np.arange(100, 117))
    ddf = dd.from_pandas(frame, npartitions=3)
    pred = cd.predict(f, ddf, columns=["c", "a", "b"], batch_size=4, output_columns=["p", "q"])
    assert isinstance(pred, dd.DataFrame) and list(pred.columns) == ["p", "q"]
    got = pred.compute(**SYNC)
    np.testing.assert_array_equal(got.index, frame.index)
    ref = frame[["c", "a", "b"]].to_numpy().astype("float32") @ np.arange(6.0).reshape(3, 2)
    np.testing.assert_allclose(got.to_numpy(), ref, rtol=1e-6)
    # A pandas frame is split into chunk_rows partitions.
    pred = cd.predict(f, frame, columns=["c", "a", "b"], chunk_rows=5)
    assert pred.npartitions == 4
    np.testing.assert_allclose(pred.compute(**SYNC).to_numpy(), ref, rtol=1e-6)


def test_empty_data_and_single_rows(cnn, images):
    pred = cd.predict(cnn, images[:0], batch_size=4)
    assert pred.compute(**SYNC).shape == (0, 3)
    pred = cd.predict(cnn, images[:3], batch_size=4, chunk_rows=1)
    assert pred.chunks[0] == (1, 1, 1)
    np.testing.assert_allclose(pred.compute(**SYNC), cnn.predict(images[:3]), rtol=1e-6,
                               atol=1e-7)


def test_nan_policy(cnn, images):
    bad = images.copy()
    bad[40, 3, 3, 1] = np.nan
    with pytest.raises(ValueError, match=r"chunk 1 \(rows 32 to 63\) has NaN in its input "
                                         r"\(first at row 40\)"):
        cd.predict(cnn, bad, chunk_rows=32, nan_policy="raise").compute(**SYNC)
    out = cd.predict(cnn, bad, chunk_rows=32, nan_policy="allow").compute(**SYNC)
    assert np.isnan(out[40]).all() and np.isfinite(np.delete(out, 40, axis=0)).all()


@pytest.mark.filterwarnings("ignore:invalid value encountered in log")
def test_nan_in_predictions_is_caught_too():
    x = K.placeholder((None, 2), name="x")
    f = K.function([x], [K.log(x)])         # log(-1) is NaN
    data = np.ones((6, 2), "float32")
    data[4, 1] = -1
    with pytest.raises(ValueError, match=r"chunk 1 \(rows 3 to 5\) has NaN in its prediction "
                                         r"\(first at row 4\)"):
        cd.predict(f, data, chunk_rows=3, nan_policy="raise").compute(**SYNC)


def test_chunk_of_the_wrong_shape_is_named(cnn, images):
    good = da.from_array(images[:20], chunks=10)
    # A chunk whose data does not match what its array declared.
    liar = da.from_delayed(dask.delayed(np.zeros)((10, 10, 9, 2), "float32"),
                           shape=(10, 10, 10, 2), dtype="float32")
    data = da.concatenate([good, liar])
    pred = cd.predict(cnn, data, batch_size=4, chunk_rows="keep")
    with pytest.raises(ValueError, match=r"chunk 2 \(rows 20 to 29\) has shape "
                                         r"\(10, 10, 9, 2\); the model takes samples of shape "
                                         r"\(n, 10, 10, 2\)"):
        pred.compute(**SYNC)
    # Joined into one task with its neighbours, the block still names its rows.
    pred = cd.predict(cnn, data, batch_size=4, chunk_rows="auto")
    assert pred.numblocks[0] < 3
    with pytest.raises(ValueError, match=r"chunk \d \(rows 20 to 29\) has shape \(10, 10, 9, 2\)"):
        pred.compute(**SYNC)


def test_output_without_one_row_per_input_row_is_named():
    x = K.placeholder((None, 2), name="x")
    f = K.function([x], [x[:1]])          # one row whatever the batch
    with pytest.raises(ValueError, match=r"for chunk 0 \(rows 0 to 3\) the model's output 0 "
                                         r"has 1 rows for a batch of 2, not one per input row"):
        cd.predict(f, np.ones((4, 2), "float32"), batch_size=2, chunk_rows=4).compute(**SYNC)


def test_data_that_cannot_fit_fails_before_running(cnn, images):
    with pytest.raises(ValueError, match=r"takes samples of shape \(n, 10, 10, 2\); the data "
                                         r"has samples of shape \(10, 10, 3\)"):
        cd.predict(cnn, np.zeros((4, 10, 10, 3), "float32"))
    x, f = _mlp_function()
    frame = pd.DataFrame(np.zeros((4, 3)), columns=list("abc"))
    with pytest.raises(ValueError, match="3 columns per row"):
        cd.predict(f, frame)
    with pytest.raises(ValueError, match=r"columns \['z'\] are not in the data"):
        cd.predict(f, frame, columns=["a", "z"])


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "batch_size must be a positive integer"),
    ({"batch_size": 2.5}, "batch_size must be a positive integer"),
    ({"nan_policy": "skip"}, "nan_policy must be one of"),
    ({"threads": 0}, "threads must be 'auto' or a positive integer"),
    ({"chunk_rows": -1}, "chunk_rows must be 'auto', 'keep' or a positive integer"),
    ({"chunk_rows": "big"}, "chunk_rows must be 'auto', 'keep' or a positive integer"),
    ({"chunk_rows": "keep"}, "chunk_rows='keep' keeps a dask collection's chunks; the data is "
                             "a ndarray"),
    ({"columns": ["a"]}, "columns selects DataFrame columns"),
])
def test_bad_arguments(kwargs, message):
    x, f = _mlp_function()
    with pytest.raises(ValueError, match="cyback.dask.predict: " + message):
        cd.predict(f, np.zeros((3, 4), "float32"), **kwargs)


def test_bad_models_and_data(tmp_path):
    x, f = _mlp_function()
    with pytest.raises(TypeError, match="model must be a Keras model on cyback"):
        cd.predict(object(), np.zeros((3, 4)))
    with pytest.raises(ValueError, match="cannot read the model file"):
        cd.predict(str(tmp_path / "missing.h5"), np.zeros((3, 4)))
    (tmp_path / "junk.h5").write_bytes(b"not hdf5")
    with pytest.raises(ValueError, match="is not a Keras HDF5 model file"):
        cd.predict(str(tmp_path / "junk.h5"), np.zeros((3, 4)))
    with pytest.raises(TypeError, match="data must be a dask array"):
        cd.predict(f, {"x": 1})
    y = K.placeholder((None, 4), name="y")
    with pytest.raises(ValueError, match="the function has 2 inputs"):
        cd.predict(K.function([x, y], [x + y]), np.zeros((3, 4)))
    with pytest.raises(ValueError, match="output 1 of the function is a scalar"):
        cd.predict(K.function([x], [x, K.sum(x)]), np.zeros((3, 4)))
    v = K.variable(np.zeros(4))
    with pytest.raises(ValueError, match="the function has updates"):
        cd.predict(K.function([x], [x * 1.0], updates=[(v, v + 1)]), np.zeros((3, 4)))
    with pytest.raises(TypeError, match="cyback.dask.save: expected a dask array"):
        cd.save(np.zeros(3), tmp_path / "o")


def test_threads_in_the_local_thread_pool(cnn, images):
    cd.clear_cache()
    with dask.config.set(num_workers=1):
        cd.predict(cnn, images[:20], chunk_rows=10).compute(scheduler="threads")
    assert cd.cache_info()["threads"] == cd._cores()        # the pool's only thread
    with dask.config.set(num_workers=2 * cd._cores()):
        cd.predict(cnn, images[:20], chunk_rows=10).compute(scheduler="threads")
    assert cd.cache_info()["threads"] == 1
    cd.predict(cnn, images[:20], chunk_rows=10, threads=2).compute(scheduler="threads")
    assert cd.cache_info()["threads"] == 2


def test_process_cache_loads_once_per_token(cnn, images):
    cd.clear_cache()
    pred = cd.predict(cnn, images, batch_size=8, chunk_rows=10)
    pred.compute(**SYNC)
    pred.compute(**SYNC)
    info = cd.cache_info()
    assert (info["loads"], info["chunks"], info["rows"]) == (1, 18, 180)
    assert info["seconds"] > 0 and not info["allocator_tuned"]    # not a Dask worker
    # Another model (other weights) is another entry.
    cd.predict(_cnn(seed=1), images[:5]).compute(**SYNC)
    assert cd.cache_info()["loads"] == 2 and len(cd.cache_info()["models"]) == 2


def test_a_changed_model_is_shipped_anew(tmp_path, images):
    # predict keeps what it saved of a model object, and what it read of a
    # file, until the weights or the file change.
    model = _cnn(seed=3)
    first = cd.predict(model, images[:10]).compute(**SYNC)
    weights = model.get_weights()
    weights[-1][0] += 1.0
    model.set_weights(weights)
    second = cd.predict(model, images[:10]).compute(**SYNC)
    np.testing.assert_allclose(second, model.predict(images[:10]), rtol=1e-6, atol=1e-7)
    assert not np.allclose(first, second)
    path = str(tmp_path / "m.h5")
    _cnn(seed=4).save(path)
    before = cd.predict(path, images[:10]).compute(**SYNC)
    model.save(path)
    os.utime(path, ns=(time.time_ns() + 10 ** 9,) * 2)      # whatever the clock's resolution
    np.testing.assert_allclose(cd.predict(path, images[:10]).compute(**SYNC), second,
                               rtol=1e-6, atol=1e-7)
    assert not np.allclose(before, second)


# ------------------------------------------------------------ pickles

#: what a graph of cyback.dask carries that Dask pickles by name to ship it:
#: the functions its tasks call and the classes of the objects they take
PICKLED = ("_Model", "_Settings", "_Rows", "_task_one", "_task_all", "_frame_partition",
           "_read_rows", "_write_npy")


@pytest.mark.parametrize("name", PICKLED)
def test_what_graphs_carry_keeps_its_cyback_dask_name(name):
    # A pickle names a function or a class by module and name (pickle's
    # GLOBAL opcode, written out here): cyback.dask.<name>, whichever module
    # of the package defines it.
    obj = getattr(cd, name)
    assert (obj.__module__, obj.__qualname__) == ("cyback.dask", name)
    assert pickle.loads(b"ccyback.dask\n" + name.encode() + b"\n.") is obj


def _cyback_modules_named(data):
    """The cyback modules a pickle names (pickle and cloudpickle write a
    module name as a string of its own)."""
    return {arg for _, arg, _ in pickletools.genops(data)
            if isinstance(arg, str) and re.fullmatch(r"cyback(\.\w+)+", arg.split(" ")[0])}


def _graph_jobs(tmp_path, cnn, images):
    """One job of each shape of graph: {what: (dask collection, how to join
    the results of its output keys)}."""
    files = []
    for i, part in enumerate(np.split(images, [20, 45, 70])):
        files.append(str(tmp_path / ("x%d.npy" % i)))
        np.save(files[-1], part)
    _, two_outputs = _mlp_function()
    y = K.placeholder((None, 2), name="y")
    tanh = K.function([y], [K.tanh(y)])
    frame = dd.from_pandas(pd.DataFrame(images[:40, 0, 0], columns=list("ab")), npartitions=2)
    pred = cd.predict(cnn, images, batch_size=8, chunk_rows=32)
    return {
        "a Keras model over NumPy": (pred, np.concatenate),
        "rows of .npy files": (cd.predict(cnn, files, batch_size=8, chunk_rows=40),
                               np.concatenate),
        "from_npy_files": (cd.from_npy_files(files, chunk_rows=40), np.concatenate),
        "a function of two outputs": (
            cd.predict(two_outputs, images[:30, 0, 0].repeat(2, axis=1), chunk_rows=16)[0],
            np.concatenate),
        "a DataFrame": (cd.predict(tanh, frame, output_columns=["p", "q"]), pd.concat),
        "save": (cd.save(pred, tmp_path / "out", compute=False), lambda parts: parts[0]),
    }


@pytest.mark.parametrize("module", [pickle, cloudpickle], ids=["pickle", "cloudpickle"])
@pytest.mark.parametrize("inline_bytes", [1 << 20, 0])
def test_graphs_pickle_load_and_run(tmp_path, cnn, images, monkeypatch, module, inline_bytes):
    # What Dask ships to the workers: the graph, pickled. It names cyback's
    # objects as cyback.dask.<name> only, and loaded again it computes what
    # the graph computes. (With inline_bytes 0 the model is a key of its
    # own; the LocalCluster tests below run such graphs on workers.)
    monkeypatch.setattr(jobs, "_INLINE_BYTES", inline_bytes)
    named = set()
    for what, (job, join) in _graph_jobs(tmp_path, cnn, images).items():
        data = module.dumps(dict(job.__dask_graph__()))
        assert _cyback_modules_named(data) == {"cyback.dask"}, what
        named |= {n for n in PICKLED if n.encode() in data}
        keys = list(dask.core.flatten(job.__dask_keys__()))
        got = join(dask.get(module.loads(data), keys))
        expected = job.compute(**SYNC)
        if isinstance(expected, pd.DataFrame):
            pd.testing.assert_frame_equal(got, expected, check_index_type=False)
        elif isinstance(expected, list):
            assert got == expected and len(got) == 3, what
        else:
            np.testing.assert_array_equal(got, expected)
    assert named == set(PICKLED)        # every one of them is carried by some graph


# ------------------------------------------------------------ task size

@pytest.mark.parametrize("per_row, n_rows, row_bytes, batch, slots, rows", [
    (1e-4, 100000, 4, 64, 2, 2048),     # 0.3 s / 1e-4 = 3000 rows -> 32 batches of 64
    (1e-4, 1000, 4, 64, 4, 256),        # one task per thread: 250 rows, in whole batches
    (1e-4, 5000, 4, 64, 2, 1280),       # 3 tasks of 2048 rows -> 4, a multiple of the slots
    (1e-4, 90, 4, 64, 1, 90),           # fewer rows than a batch: one task
    (1e-2, 1000, 4, 8, 1, 16),          # a slow model: 30 rows -> 2 batches of 8
    (1e-6, 10 ** 6, 2 ** 20, 32, 1, 128),   # at most array.chunk-size (128 MiB) of input
    (1e-4, 0, 4, 64, 2, 1),
    (1e-4, 1000, 4, 64, 400, 256),      # 400 threads, but no task under 2048 / 8 rows
    (1e-6, 1000, 4, 8, 4, 1000),        # a tiny model: a few rows are one task
])
def test_auto_rows_rule(per_row, n_rows, row_bytes, batch, slots, rows):
    with dask.config.set({"array.chunk-size": "128MiB"}):
        assert task_size._auto_rows(per_row, n_rows, row_bytes, batch, slots) == rows


@pytest.mark.parametrize("sizes, rows, groups", [
    ((25, 25, 25, 15), 50, [[0, 1], [2, 3]]),
    ((10,) * 7, 30, [[0, 1, 2], [3, 4, 5], [6]]),
    ((100, 10, 10, 200, 5), 50, [[0], [1, 2], [3], [4]]),   # big chunks are not split
    ((10, 10), 14, [[0], [1]]),         # 20 rows is further from 14 than 10 is
    ((10, 10), 15, [[0, 1]]),
    ((), 10, [[]]),
])
def test_small_chunks_are_joined_with_their_neighbours(sizes, rows, groups):
    assert task_size._merged(sizes, rows) == groups


def test_chunks_on_different_workers_are_not_joined():
    holders = [("a",), ("a",), ("b",), ("a",), ("a",), ("a",)]
    assert task_size._merged((10,) * 6, 30, holders) == [[0, 1], [2], [3, 4, 5]]


def test_batches_span_blocks_and_are_views_within_one():
    blocks = [np.arange(5.0), np.arange(5.0, 8.0), np.arange(8.0, 18.0)]
    batches = list(model._batches(blocks, 4))
    assert [len(b) for b in batches] == [4, 4, 4, 4, 2]
    np.testing.assert_array_equal(np.concatenate(batches), np.arange(18.0))
    assert np.shares_memory(batches[0], blocks[0]) and np.shares_memory(batches[3], blocks[2])


def test_probe_times_two_batches_of_zeros_once_per_model(cnn):
    task_size._probes.clear()
    runner = model._Runner(cnn)
    run_batch, seen = runner.run_batch, []
    runner.run_batch = lambda b: seen.append((b.shape, float(abs(b).max()))) or run_batch(b)
    sample = np.zeros((10, 10, 2), "float32")
    per_row = task_size._seconds_per_row(runner, "token", sample, 8)
    assert 0 < per_row < 1 and seen == [((8, 10, 10, 2), 0.0)] * 2
    assert task_size._seconds_per_row(runner, "token", sample, 8) == per_row and len(seen) == 2


def test_probe_counts_the_model_cpu_time_not_the_wait(cnn):
    # A batch that waits 50 ms for the core (as on a busy machine) takes no
    # more CPU time than one that does not.
    task_size._probes.clear()
    runner = model._Runner(cnn)
    run_batch = runner.run_batch
    runner.run_batch = lambda b: time.sleep(0.05) or run_batch(b)
    per_row = task_size._seconds_per_row(runner, "token", np.zeros((10, 10, 2), "float32"), 8)
    assert 0 < per_row < 0.01 / 8


@pytest.fixture
def rows_32_per_task(monkeypatch):
    # The probe says a task's time is 32 rows (4 batches of 8).
    monkeypatch.setattr(jobs, "_seconds_per_row", lambda *a: task_size._TASK_SECONDS / 32)


def test_auto_chunks_for_each_kind_of_data(tmp_path, cnn, images, rows_32_per_task):
    ref = cnn.predict(images, batch_size=8)
    with dask.config.set(scheduler="synchronous"):          # one slot
        # NumPy: 3 tasks (90 / 32 rows), cut evenly in whole batches, each slice in its task.
        pred = cd.predict(cnn, images, batch_size=8)
        assert pred.chunks[0] == (32, 32, 26)
        assert len(dict(pred.__dask_graph__())) == 3        # the model rides in the tasks too
        changed = images.copy()
        later = cd.predict(cnn, changed, batch_size=8)
        changed[:] = 0                          # after predict: the job sees the data before
        np.testing.assert_allclose(pred.compute(), ref, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(later.compute(), ref, rtol=1e-6, atol=1e-7)
        # A dask array's small chunks are joined, three to a task.
        pred = cd.predict(cnn, da.from_array(images, chunks=10), batch_size=8)
        assert pred.chunks[0] == (30, 30, 30)
        np.testing.assert_allclose(pred.compute(), ref, rtol=1e-6, atol=1e-7)
        # Its big chunks are kept.
        pred = cd.predict(cnn, da.from_array(images, chunks=45), batch_size=8)
        assert pred.chunks[0] == (45, 45)
        # .npy files, as paths or through from_npy_files: rows across files.
        files = []
        for i, part in enumerate(np.split(images, [20, 45, 70])):
            files.append(str(tmp_path / ("x%d.npy" % i)))
            np.save(files[-1], part)
        for data in (files, cd.from_npy_files(files)):
            pred = cd.predict(cnn, data, batch_size=8)
            assert pred.chunks[0] == (32, 32, 26)
            np.testing.assert_allclose(pred.compute(), ref, rtol=1e-6, atol=1e-7)
        # from_npy_files' own chunks, kept; its array sliced is an ordinary dask array.
        x = cd.from_npy_files(files, chunk_rows=40)
        assert x.chunks[0] == (40, 40, 10)
        np.testing.assert_array_equal(x.compute(), images)
        one = cd.from_npy_files(files[:1]).compute()       # a file's own pages, copy on write
        one[0] = 7
        np.testing.assert_array_equal(np.load(files[0]), images[:20])
        pred = cd.predict(cnn, x, batch_size=8, chunk_rows="keep")
        assert pred.chunks[0] == (40, 40, 10)
        np.testing.assert_allclose(pred.compute(), ref, rtol=1e-6, atol=1e-7)
        pred = cd.predict(cnn, x[5:], batch_size=8)
        assert pred.chunks[0] == (35, 40, 10)
        np.testing.assert_allclose(pred.compute(), ref[5:], rtol=1e-6, atol=1e-7)
        # pandas: partitions of that many rows.
        x = K.placeholder((None, 4), name="x")
        w = np.arange(8.0).reshape(4, 2)
        f = K.function([x], [K.dot(x, K.variable(w))])
        frame = pd.DataFrame(np.random.RandomState(2).rand(70, 4), columns=list("abcd"))
        pred = cd.predict(f, frame, batch_size=8)
        assert pred.npartitions == 3
        np.testing.assert_allclose(pred.compute().to_numpy(),
                                   frame.to_numpy("float32") @ w, rtol=1e-5)


def test_auto_rows_leave_no_slot_idle(cnn, images, rows_32_per_task):
    # 90 rows are 3 tasks of 32: as many as dask's local pool has threads, or
    # the next multiple of them.
    for slots, chunks in [(1, (32, 32, 26)), (3, (32, 32, 26)), (4, (24, 24, 24, 18))]:
        with dask.config.set(scheduler="threads", num_workers=slots):
            pred = cd.predict(cnn, images, batch_size=8)
            assert pred.chunks[0] == chunks
            np.testing.assert_allclose(pred.compute(), cnn.predict(images), rtol=1e-6,
                                       atol=1e-7)


def test_a_tiny_job_is_one_task(cnn, images):
    # The probe's own figure for this tiny model: 90 rows are much less than
    # an eighth of a task, so not worth splitting over the pool's threads.
    with dask.config.set(scheduler="threads", num_workers=4):
        pred = cd.predict(cnn, images, batch_size=8)
        assert pred.numblocks[0] == 1
        np.testing.assert_allclose(pred.compute(), cnn.predict(images), rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------ LocalCluster

@pytest.fixture(scope="module")
def client():
    # Started as docs/dask.md advises for scoring (the nannies pass the
    # settings to their workers, also to one restarted after a kill).
    with dask.config.set(cd.SCORING_CONFIG):
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           dashboard_address=None, silence_logs=40)
    c = distributed.Client(cluster)
    try:
        yield c
    finally:
        c.close()
        cluster.close()


def _per_worker(client, fn):
    return list(client.run(fn).values())


def _monitoring(dask_worker=None, dask_scheduler=None):
    server = dask_worker or dask_scheduler
    return {k: pc.callback_time for k, pc in server.periodic_callbacks.items()
            if k in ("profile", "tick", "memory_monitor", "monitor")}


def test_scoring_config_names_dask_settings():
    # Each key exists in Dask's own defaults (a renamed key would be ignored).
    for key, value in cd.SCORING_CONFIG.items():
        default = dask.config.get(key)
        assert type(default) is type(value) and default != value, key


def test_scoring_config_reaches_the_workers_and_the_scheduler(client):
    ms = dask.utils.parse_timedelta
    expected = {"tick": ms(cd.SCORING_CONFIG["distributed.admin.tick.interval"]) * 1000,
                "memory_monitor":
                    ms(cd.SCORING_CONFIG["distributed.worker.memory.monitor-interval"]) * 1000,
                "monitor":
                    ms(cd.SCORING_CONFIG["distributed.admin.system-monitor.interval"]) * 1000}
    for got in client.run(_monitoring).values():
        assert got == expected          # no "profile": Dask's profiler is off
    scheduler = client.run_on_scheduler(_monitoring)
    assert scheduler == {k: expected[k] for k in ("tick", "monitor")}


@pytest.mark.parametrize("inline_bytes", [1 << 20, 0])
def test_cluster_matches_local_and_loads_once_per_worker(client, cnn, images, monkeypatch,
                                                         inline_bytes):
    # A small model rides in each task; a big one is a key of its own.
    monkeypatch.setattr(jobs, "_INLINE_BYTES", inline_bytes)
    client.run(cd.clear_cache)
    pred = cd.predict(cnn, images, batch_size=6, chunk_rows=6)
    model_keys = [k for k in pred.__dask_graph__() if str(k).startswith("_Model-")]
    assert len(model_keys) == (0 if inline_bytes else 1)
    got = pred.compute()
    np.testing.assert_allclose(got, cnn.predict(images, batch_size=6), rtol=1e-6, atol=1e-7)
    infos = _per_worker(client, cd.cache_info)
    assert sum(i["chunks"] for i in infos) == 15
    for info in infos:
        # Once per worker process, not once per task.
        assert info["loads"] == (1 if info["chunks"] else 0)
        if info["chunks"]:
            # Two single-thread workers on this host: cores // 2 threads each.
            assert info["threads"] == max(1, cd._cores() // 2)
            # The nanny's MALLOC_TRIM_THRESHOLD_ is undone (glibc only).
            assert info["allocator_tuned"]
    again = cd.predict(cnn, images, batch_size=6, chunk_rows=6).compute()
    np.testing.assert_array_equal(again, got)
    assert all(i["loads"] <= 1 for i in _per_worker(client, cd.cache_info))


def test_cluster_auto_chunks_give_each_worker_thread_a_task(client, tmp_path, cnn, images,
                                                            rows_32_per_task):
    ref = cnn.predict(images, batch_size=8)
    # 3 tasks' worth of rows, 2 worker threads: 4 tasks.
    pred = cd.predict(cnn, images, batch_size=8)
    assert pred.chunks[0] == (24, 24, 24, 18)
    np.testing.assert_allclose(pred.compute(), ref, rtol=1e-6, atol=1e-7)
    files = []
    for i, part in enumerate(np.split(images, [20, 45, 70])):
        files.append(str(tmp_path / ("x%d.npy" % i)))
        np.save(files[-1], part)
    pred = cd.predict(cnn, cd.from_npy_files(files), batch_size=8)
    assert pred.chunks[0] == (24, 24, 24, 18)
    np.testing.assert_allclose(pred.compute(), ref, rtol=1e-6, atol=1e-7)
    pred = cd.predict(cnn, da.from_array(images, chunks=8), batch_size=8)
    assert pred.chunks[0] == (24, 24, 24, 18)
    np.testing.assert_allclose(pred.compute(), ref, rtol=1e-6, atol=1e-7)


def test_cluster_joins_persisted_chunks_only_where_they_are(client, cnn, images,
                                                            rows_32_per_task):
    x = client.persist(da.from_array(images, chunks=(6, 10, 10, 2)))
    distributed.wait(x)
    where = {k: v[0] for k, v in client.who_has(x).items()}
    pred = cd.predict(cnn, x, batch_size=6)         # tasks of 24 rows: 4 chunks
    tasks = list(dict(pred.__dask_graph__().layers[pred.name]).values())
    assert sum(len(t[1]) for t in tasks) == 15 and max(len(t[1]) for t in tasks) <= 4
    for task in tasks:
        assert len({where[k] for k in task[1]}) == 1        # no chunk moves
    if len(set(where.values())) == 1:
        assert len(tasks) == 4
    np.testing.assert_allclose(pred.compute(), cnn.predict(images), rtol=1e-6, atol=1e-7)


def test_cluster_function_dataframe_and_threads_option(client):
    x, f = _mlp_function()
    client.run(cd.clear_cache)
    data = np.random.RandomState(6).rand(40, 4).astype("float32")
    a, b = cd.predict(f, data, batch_size=3, chunk_rows=7, threads=1)
    got = dask.compute(a, b)
    for g, r in zip(got, f([data])):
        np.testing.assert_allclose(g, r, rtol=1e-6)
    assert {i["threads"] for i in _per_worker(client, cd.cache_info) if i["chunks"]} == {1}
    frame = dd.from_pandas(pd.DataFrame(data, columns=list("abcd")), npartitions=4)
    w = K.variable(np.ones((4, 1)))
    g = K.function([x], [K.dot(x, w)])
    out = cd.predict(g, frame, columns=list("abcd")).compute()
    np.testing.assert_allclose(out[0].to_numpy(), data.sum(axis=1), rtol=1e-5)


def test_cluster_error_names_the_chunk(client, cnn, images):
    bad = images.copy()
    bad[75, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match=r"chunk 2 \(rows 60 to 89\).*first at row 75"):
        cd.predict(cnn, bad, chunk_rows=30, nan_policy="raise").compute()


def test_killed_worker_does_not_change_the_result(client):
    # A model slow enough that the job is still running when a worker dies.
    # (40 chunks of ~80 MFLOP: tens of ms each on one core.)
    x = K.placeholder((None, 128), name="x")
    w = K.variable(np.random.RandomState(7).randn(128, 128) / 11, name="w")
    y = x
    for _ in range(40):
        y = K.tanh(K.dot(y, w))
    f = K.function([x], [y])
    data = np.random.RandomState(8).rand(2400, 128).astype("float32")
    pred = cd.predict(f, data, batch_size=20, chunk_rows=60)
    expected = pred.compute()
    client.run(cd.clear_cache)
    future = client.compute(pred)
    deadline = time.time() + 60
    while sum(i["chunks"] for i in _per_worker(client, cd.cache_info)) < 4:
        assert time.time() < deadline and not future.done()
        time.sleep(0.02)
    pids = client.run(os.getpid)
    victim = sorted(pids)[0]
    assert not future.done()            # the worker dies mid-job
    os.kill(pids[victim], signal.SIGKILL)
    got = future.result(timeout=120)
    np.testing.assert_array_equal(got, expected)
    client.wait_for_workers(2, timeout=60)
    assert victim not in client.run(os.getpid)
