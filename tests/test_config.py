"""Configuration and session state: keras.json, floatx/epsilon/data format,
learning phase, uids, name scopes, clear_session, the session shim, threads."""
import json
import os
import sys

import numpy as np
import pytest

import cyback as K
from cyback import config
from cyback.graph import function as _function


@pytest.fixture
def fresh_settings(monkeypatch):
    """Isolate config._settings/_sources so that loading keras.json leaks nothing,
    and hide the settings mirror (Keras's copy, when another test imported
    Keras: cyback then defers to it)."""
    monkeypatch.setitem(config._mirror, "find", lambda: None)
    monkeypatch.setattr(config, "_settings", dict(config._settings))
    monkeypatch.setattr(config, "_sources", dict(config._sources))
    return config._settings


def _write_json(folder, cfg):
    with open(os.path.join(str(folder), "keras.json"), "w") as f:
        f.write(cfg if isinstance(cfg, str) else json.dumps(cfg))


# ------------------------------------------------------------------ keras.json

def test_keras_home_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    assert config.keras_home() == str(tmp_path)


def test_keras_home_default(monkeypatch):
    monkeypatch.delenv("KERAS_HOME", raising=False)
    home = config.keras_home()
    assert os.path.basename(home) == ".keras"


def test_load_keras_json(monkeypatch, tmp_path, fresh_settings):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    _write_json(tmp_path, {"floatx": "float64", "epsilon": 1e-5,
                           "image_data_format": "channels_first", "backend": "cyback"})
    config._load_keras_json()
    assert fresh_settings == {"floatx": "float64", "epsilon": 1e-5,
                              "image_data_format": "channels_first"}
    assert K.floatx() == "float64"
    assert K.epsilon() == 1e-5
    assert K.image_data_format() == "channels_first"
    path = os.path.join(str(tmp_path), "keras.json")
    assert config.settings_sources() == {"floatx": path, "epsilon": path,
                                         "image_data_format": path}
    # Defaults follow the loaded values.
    assert K.dtype(K.variable(1.0)) == "float64"
    assert K.normalize_data_format(None) == "channels_first"


@pytest.mark.parametrize("key,value,shown", [
    ("floatx", "float8", '"float8"'),
    ("floatx", None, "null"),
    ("epsilon", -1.0, "-1.0"),
    ("epsilon", "small", '"small"'),
    ("epsilon", True, "true"),
    ("epsilon", [1e-7], r"\[1e-07\]"),
    ("image_data_format", "channels_middle", '"channels_middle"'),
])
def test_load_keras_json_warns_about_bad_values(monkeypatch, tmp_path, fresh_settings,
                                                key, value, shown):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    good = {"floatx": "float64", "epsilon": 1e-4, "image_data_format": "channels_first"}
    cfg = dict(good)
    cfg[key] = value
    _write_json(tmp_path, cfg)
    path = os.path.join(str(tmp_path), "keras.json")
    default = {"floatx": "float32", "epsilon": 1e-7, "image_data_format": "channels_last"}[key]
    with pytest.warns(config.ConfigWarning) as record:
        config._load_keras_json()
    assert len(record) == 1
    msg = str(record[0].message)
    assert msg.startswith("cyback: " + path)
    assert "'%s'" % key in msg
    assert __import__("re").search(shown, msg), msg
    assert msg.endswith("using %r" % default)
    good[key] = default
    assert fresh_settings == good                 # the other keys still apply
    assert config.settings_sources()[key] == "default"


@pytest.mark.parametrize("text,shown", [("NaN", "NaN"), ("Infinity", "Infinity"),
                                        ("-1e-3", "-0.001")])
def test_load_keras_json_epsilon_not_finite(monkeypatch, tmp_path, fresh_settings, text, shown):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    _write_json(tmp_path, '{"epsilon": %s}' % text)
    with pytest.warns(config.ConfigWarning, match=r"'epsilon' is %s, expected a finite "
                      r"non-negative number; using 1e-07" % shown):
        config._load_keras_json()
    assert fresh_settings["epsilon"] == 1e-7


def test_load_keras_json_int_epsilon_is_taken(monkeypatch, tmp_path, fresh_settings):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    _write_json(tmp_path, {"epsilon": 0})
    config._load_keras_json()
    assert fresh_settings["epsilon"] == 0.0 and isinstance(fresh_settings["epsilon"], float)


@pytest.mark.parametrize("text,msg", [("{not json", "is not valid JSON"),
                                      ("[1, 2]", "must hold a JSON object, got list"),
                                      ("", "is not valid JSON")])
def test_load_keras_json_warns_about_broken_file(monkeypatch, tmp_path, fresh_settings,
                                                 text, msg):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    before = dict(fresh_settings)
    _write_json(tmp_path, text)
    with pytest.warns(config.ConfigWarning, match=msg + ".*using the defaults floatx='float32'"):
        config._load_keras_json()
    assert fresh_settings == before


def test_bad_keras_json_does_not_stop_import(tmp_path):
    import subprocess
    _write_json(tmp_path, '{"epsilon": NaN, "floatx": "float8"')
    env = dict(os.environ, KERAS_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", "import cyback; print(cyback.epsilon())"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1e-07"
    assert "ConfigWarning" in out.stderr and "keras.json is not valid JSON" in out.stderr


def test_load_keras_json_missing_file(monkeypatch, tmp_path, fresh_settings):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "nowhere"))
    before = dict(fresh_settings)
    config._load_keras_json()
    assert fresh_settings == before


# ------------------------------------------------------------------ setters

def test_floatx_roundtrip():
    for f in ("float16", "float64", "float32"):
        K.set_floatx(f)
        assert K.floatx() == f
        assert K.variable([1.0]).dtype == f
        assert K.placeholder((2,)).dtype == f
        assert K.cast_to_floatx([1, 2]).dtype == np.dtype(f)


@pytest.mark.parametrize("bad", ["float8", "int32", "", None, 32])
def test_set_floatx_bad(bad):
    with pytest.raises(ValueError, match="set_floatx"):
        K.set_floatx(bad)


def test_epsilon_roundtrip():
    K.set_epsilon(1e-5)
    assert K.epsilon() == 1e-5
    assert isinstance(K.epsilon(), float)


@pytest.mark.parametrize("bad", ["tiny", None, -1.0, float("nan"), float("inf")])
def test_set_epsilon_bad(bad):
    with pytest.raises(ValueError, match="set_epsilon"):
        K.set_epsilon(bad)


def test_image_data_format_roundtrip():
    K.set_image_data_format("channels_first")
    assert K.image_data_format() == "channels_first"
    K.set_image_data_format("channels_last")
    assert K.image_data_format() == "channels_last"


@pytest.mark.parametrize("bad", ["channels_middle", "NHWC", None, 1])
def test_set_image_data_format_bad(bad):
    with pytest.raises(ValueError, match="set_image_data_format"):
        K.set_image_data_format(bad)


def test_normalize_data_format():
    assert K.normalize_data_format("Channels_First") == "channels_first"
    K.set_image_data_format("channels_first")
    assert K.normalize_data_format(None) == "channels_first"
    with pytest.raises(ValueError, match="data_format"):
        K.normalize_data_format("nchw")


def test_backend_name():
    assert K.backend() == "cyback"


# ------------------------------------------------------------------ learning phase

def test_learning_phase_default_is_symbolic(fresh_learning_phase):
    lp = K.learning_phase()
    assert K.is_placeholder(lp)
    assert K.int_shape(lp) == ()
    assert K.learning_phase() is lp


def test_set_learning_phase(fresh_learning_phase):
    K.set_learning_phase(1)
    assert K.learning_phase() == 1
    K.set_learning_phase(0)
    assert K.learning_phase() == 0


@pytest.mark.parametrize("bad", [2, -1, 0.5, "train", None])
def test_set_learning_phase_bad(bad, fresh_learning_phase):
    with pytest.raises(ValueError, match="set_learning_phase"):
        K.set_learning_phase(bad)


def test_clear_session_resets_learning_phase(fresh_learning_phase):
    K.set_learning_phase(1)
    K.clear_session()
    assert K.is_placeholder(K.learning_phase())


# ------------------------------------------------------------------ uids, scopes

def test_get_uid_and_reset():
    K.reset_uids()
    assert [K.get_uid("dense"), K.get_uid("dense"), K.get_uid("conv"), K.get_uid()] == [1, 2, 1, 1]
    K.reset_uids()
    assert K.get_uid("dense") == 1


def test_clear_session_resets_uids_and_caches():
    K.get_uid("dense")
    v = K.variable([1.0, 2.0])
    K.eval(v * 2)
    assert len(_function._eval_cache) > 0
    K.clear_session()
    assert K.get_uid("dense") == 1
    assert len(_function._eval_cache) == 0
    # Tensors made before still work.
    np.testing.assert_allclose(K.eval(v * 2), [2.0, 4.0])


def test_name_scope_prefixes_names():
    with K.name_scope("block1") as scope:
        assert scope == "block1"
        x = K.placeholder((2,), name="x")
        with K.name_scope("inner"):
            v = K.variable(1.0, name="w")
    assert x.name == "block1/x"
    assert v.name == "block1/inner/w"
    assert K.placeholder((2,), name="y").name == "y"


def test_name_scope_pops_on_error():
    with pytest.raises(RuntimeError):
        with K.name_scope("failing"):
            raise RuntimeError("boom")
    assert config.current_scope() == ""


@pytest.mark.parametrize("bad", ["", None, 3])
def test_name_scope_bad(bad):
    with pytest.raises(ValueError, match="name_scope"):
        K.name_scope(bad)


# ------------------------------------------------------------------ session shim

def test_get_session_run():
    sess = K.get_session()
    x = K.placeholder((None, 2))
    v = K.variable([[1.0, 2.0]])
    out = sess.run([x * 2, v], feed_dict={x: np.ones((3, 2))})
    np.testing.assert_allclose(out[0], 2 * np.ones((3, 2)))
    np.testing.assert_allclose(out[1], [[1.0, 2.0]])
    np.testing.assert_allclose(sess.run(v + 1), [[2.0, 3.0]])
    assert K.get_session() is sess


def test_get_session_run_missing_feed():
    x = K.placeholder((None, 2), name="not_fed")
    with pytest.raises(ValueError, match="not_fed"):
        K.get_session().run(x * 2)


def test_set_session():
    old = K.get_session()

    class Fake(object):
        def run(self, fetches, feed_dict=None):
            return "fake"
    try:
        K.set_session(Fake())
        assert K.get_session().run(None) == "fake"
    finally:
        K.set_session(old)
    with pytest.raises(TypeError, match="set_session"):
        K.set_session(object())


def test_graph_and_decorators():
    g = K.get_graph()
    with g.as_default():
        pass
    f = K.symbolic(lambda: 3)
    assert f() == 3 and K.eager(f)() == 3
    assert K.is_symbolic(K.placeholder((1,)))
    assert not K.is_symbolic(np.ones(2))
    K.manual_variable_initialization(True)
    K.manual_variable_initialization(False)


# ------------------------------------------------------------------ threads

def test_num_threads_roundtrip():
    n0 = K.get_num_threads()
    assert n0 >= 1
    try:
        K.set_num_threads(1)
        assert K.get_num_threads() == 1
        # Results do not depend on the thread count.
        a = np.random.RandomState(0).randn(4, 5, 6).astype("float32")
        b = np.random.RandomState(1).randn(4, 6, 3).astype("float32")
        one = K.eval(K.batch_dot(K.variable(a), K.variable(b), axes=(2, 1)))
        K.set_num_threads(2)
        two = K.eval(K.batch_dot(K.variable(a), K.variable(b), axes=(2, 1)))
        np.testing.assert_allclose(one, two, rtol=1e-6)
    finally:
        K.set_num_threads(n0)
    assert K.get_num_threads() == n0


@pytest.mark.parametrize("bad", [0, -2, 1.5, "4", True, None, 10 ** 10, -10 ** 10, 2 ** 31,
                                 4097])
def test_set_num_threads_bad(bad):
    n0 = K.get_num_threads()
    with pytest.raises(ValueError, match="^set_num_threads: expected an integer"):
        K.set_num_threads(bad)
    from cyback.kernels import runtime
    with pytest.raises(ValueError, match="^set_num_threads"):
        runtime.set_num_threads(bad)
    assert K.get_num_threads() == n0


def test_set_num_threads_numpy_integer():
    n0 = K.get_num_threads()
    try:
        K.set_num_threads(np.int64(1))
        assert K.get_num_threads() == 1
    finally:
        K.set_num_threads(n0)


def _import_with_env(**env):
    import subprocess
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", "import cyback"], env=full,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("var,value,msg", [
    ("CYBACK_PARALLEL_MIN_WORK", "abc", "CYBACK_PARALLEL_MIN_WORK must be a finite non-negative"),
    ("CYBACK_PARALLEL_MIN_WORK", "-1", "CYBACK_PARALLEL_MIN_WORK must be"),
    ("CYBACK_PARALLEL_MIN_WORK", "nan", "CYBACK_PARALLEL_MIN_WORK must be"),
    ("CYBACK_PARALLEL_MIN_WORK", "", "CYBACK_PARALLEL_MIN_WORK must be"),
    ("CYBACK_NUM_THREADS", "10000000000", "CYBACK_NUM_THREADS must be an integer from 1 to"),
    ("CYBACK_NUM_THREADS", "two", "CYBACK_NUM_THREADS must be an integer"),
    ("CYBACK_BLAS_THREADS", "-3", "CYBACK_BLAS_THREADS must be an integer"),
    ("CYBACK_TEAM_WARM_US", "soon", "CYBACK_TEAM_WARM_US must be a finite non-negative number "
                                    "of microseconds"),
    ("CYBACK_TEAM_WARM_US", "-5", "CYBACK_TEAM_WARM_US must be"),
    ("CYBACK_TEAM_WARM_US", "inf", "CYBACK_TEAM_WARM_US must be"),
    ("CYBACK_JOIN_US", "later", "CYBACK_JOIN_US must be a finite non-negative number "
                                "of microseconds"),
    ("CYBACK_JOIN_US", "-1", "CYBACK_JOIN_US must be"),
])
def test_bad_thread_settings_in_the_environment(monkeypatch, var, value, msg):
    # Settings read at import warn and fall back to the default, like keras.json.
    for name in ("CYBACK_PARALLEL_MIN_WORK", "CYBACK_NUM_THREADS", "CYBACK_BLAS_THREADS",
                 "CYBACK_TEAM_WARM_US", "CYBACK_JOIN_US"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(var, value)
    n0 = K.get_num_threads()
    from cyback.kernels import runtime
    warm, join = runtime.get_warm_window(), runtime.get_join_window()
    try:
        with pytest.warns(config.ConfigWarning, match="cyback: " + msg + ".*using the default"):
            config._init_threads()
        assert K.get_num_threads() == config._cpu_budget.default_threads()
        assert runtime.get_warm_window() == runtime.warm_window()
        assert runtime.get_join_window() == runtime.join_window()
        if var != "CYBACK_NUM_THREADS" and var != "CYBACK_BLAS_THREADS":
            # removed, so that the kernels, which read it themselves, use the default
            assert var not in os.environ
    finally:
        K.set_num_threads(n0)
        runtime.set_warm_window(warm)
        runtime.set_join_window(join)


def test_bad_setting_warns_and_import_goes_on():
    out = _import_with_env(CYBACK_PARALLEL_MIN_WORK="abc", CYBACK_NUM_THREADS="two")
    assert out.returncode == 0, out.stderr
    assert "ConfigWarning: cyback: CYBACK_PARALLEL_MIN_WORK must be" in out.stderr, out.stderr
    assert "ConfigWarning: cyback: CYBACK_NUM_THREADS must be" in out.stderr, out.stderr


def test_good_thread_settings_are_taken_as_given(monkeypatch, recwarn):
    # Good values reach the runtime, stay in the environment (where the
    # kernels read them too) and are not warned about.
    for name in ("CYBACK_NUM_THREADS", "CYBACK_BLAS_THREADS", "CYBACK_JOIN_US"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CYBACK_PARALLEL_MIN_WORK", "2.5e5")
    monkeypatch.setenv("CYBACK_TEAM_WARM_US", "40")
    from cyback.kernels import runtime
    n0, work, warm = K.get_num_threads(), runtime.parallel_min_work(), runtime.get_warm_window()
    try:
        config._init_threads()
        assert runtime.parallel_min_work() == 2.5e5
        assert runtime.get_warm_window() == pytest.approx(40e-6, rel=1e-12)
        assert os.environ["CYBACK_PARALLEL_MIN_WORK"] == "2.5e5"
        assert os.environ["CYBACK_TEAM_WARM_US"] == "40"
    finally:
        K.set_num_threads(n0)
        runtime.set_parallel_min_work(work)
        runtime.set_warm_window(warm)
    assert not [w for w in recwarn if issubclass(w.category, config.ConfigWarning)]


_PROCESS_CHILD = """
import os
import cyback
from cyback.kernels import memory
print(os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT"),
      "CYBACK_WINOGRAD" in os.environ, memory.settings(), memory._glibc())
"""


def _process_settings_with_env(**env):
    import subprocess
    full = {k: v for k, v in os.environ.items()
            if not k.startswith("MALLOC_") and k not in (
                "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "GLIBC_TUNABLES", "CYBACK_MALLOC",
                "CYBACK_WINOGRAD")}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", _PROCESS_CHILD], env=full,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    wait, spin, winograd, allocator, glibc = out.stdout.split()
    return (wait, spin, winograd == "True", allocator, glibc == "True"), out.stderr


def test_what_import_changes_in_the_process():
    # cyback/kernels/process.py's three effects, and their opt-outs.
    (wait, spin, winograd, allocator, glibc), err = _process_settings_with_env(
        CYBACK_WINOGRAD="sometimes")
    assert (wait, spin) == ("PASSIVE", "2000")
    assert not winograd and "CYBACK_WINOGRAD must be 0 or 1" in err
    assert allocator == ("kept" if glibc else "system")
    (wait, spin, winograd, allocator, _), err = _process_settings_with_env(
        OMP_WAIT_POLICY="ACTIVE", CYBACK_MALLOC="system", CYBACK_WINOGRAD="0")
    assert (wait, spin, winograd, allocator) == ("ACTIVE", "None", True, "system")
    assert "ConfigWarning" not in err


class _Holder(object):
    """A settings mirror as Keras's copy is one."""

    def __init__(self, epsilon):
        self.values = {"floatx": "float64", "epsilon": epsilon,
                       "image_data_format": "channels_first"}

    def floatx(self):
        return self.values["floatx"]

    def epsilon(self):
        return self.values["epsilon"]

    def set_epsilon(self, e):
        self.values["epsilon"] = e

    def image_data_format(self):
        return self.values["image_data_format"]

    def set_image_data_format(self, f):
        self.values["image_data_format"] = f


def test_a_registered_mirror_is_read_and_written(monkeypatch, fresh_settings):
    holder = _Holder(-1.0)
    config.register_settings_mirror(lambda: holder)
    # An epsilon keras.json's check refuses is replaced by the one in use here.
    assert holder.epsilon() == config._settings["epsilon"]
    assert (K.floatx(), K.image_data_format()) == ("float64", "channels_first")
    K.set_epsilon(1e-3)
    K.set_image_data_format("channels_last")
    assert holder.values["epsilon"] == 1e-3 == K.epsilon()
    assert holder.values["image_data_format"] == "channels_last"
    # A mirror that is absent for now (Keras not imported): this module's own values.
    config.register_settings_mirror(lambda: None)
    assert K.floatx() == config._settings["floatx"]


def test_keras_with_bad_epsilon_in_keras_json_uses_the_default(tmp_path):
    pytest.importorskip("h5py")
    import importlib.util
    spec = importlib.util.find_spec("keras")
    if spec is None or spec.origin is None:
        pytest.skip("multi-backend keras is not installed")
    import subprocess
    _write_json(tmp_path, {"epsilon": -1.0, "backend": "cyback"})
    env = dict(os.environ, KERAS_HOME=str(tmp_path), KERAS_BACKEND="cyback",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    code = "import keras; print(keras.backend.epsilon())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "1e-07"
    assert "'epsilon' is -1.0" in out.stderr
