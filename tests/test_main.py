"""``python -m cyback``'s hint on which backend Keras would load."""
import json

from cyback.__main__ import keras_backend_hint, keras_json_path


def test_keras_json_path_follows_keras_home(tmp_path):
    assert keras_json_path({"KERAS_HOME": str(tmp_path)}) == str(tmp_path / "keras.json")
    assert keras_json_path({}).endswith("keras.json")


def test_hint_for_the_tensorflow_default_keras_writes(tmp_path):
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "tensorflow"}))
    hint = keras_backend_hint({"KERAS_HOME": str(tmp_path)})
    assert hint.startswith("tensorflow (")
    assert "KERAS_BACKEND=cyback" in hint and '"backend": "cyback"' in hint
    assert str(tmp_path / "keras.json") in hint


def test_hint_when_cyback_is_selected(tmp_path):
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "cyback"}))
    assert keras_backend_hint({"KERAS_HOME": str(tmp_path)}).startswith("cyback (")
    env = {"KERAS_HOME": str(tmp_path), "KERAS_BACKEND": "cyback"}
    assert keras_backend_hint(env) == "cyback (KERAS_BACKEND)"


def test_hint_without_keras_json(tmp_path):
    hint = keras_backend_hint({"KERAS_HOME": str(tmp_path / "none")})
    assert hint.startswith("tensorflow (Keras's default")
    assert "KERAS_BACKEND=cyback" in hint


# ------------------------------------------------------------ the command line

import os  # noqa: E402
import shutil  # noqa: E402
import stat  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from cyback import __main__ as cmd  # noqa: E402
from cyback import cli  # noqa: E402


def _run(*args, **env):
    return subprocess.run([sys.executable, "-m", "cyback"] + list(args),
                          env=dict(os.environ, **env), capture_output=True, text=True,
                          timeout=300)


def test_help_prints_usage_and_exits_0():
    out = _run("--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m cyback")
    for command in ("info", "demo", "bench", "settings", "set-default-backend", "inspect",
                    "predict"):
        assert command in out.stdout
    assert "epoch" not in out.stdout            # it did not start training


@pytest.mark.parametrize("argv", [["nope"], ["inspect"], ["predict", "m.h5"],
                                  ["demo", "--epochs", "0"], ["info", "--bogus"],
                                  ["predict", "m.h5", "x.npy", "--batch-size", "x"]])
def test_unknown_commands_and_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cmd.main(argv)
    assert e.value.code == 2
    assert "usage: python -m cyback" in capsys.readouterr().err


def test_no_command_runs_the_demo(monkeypatch):
    calls = []
    monkeypatch.setattr(cmd, "demo", lambda epochs=60: calls.append(epochs) or 0)
    assert cmd.main([]) == 0
    assert cmd.main(["demo", "--epochs", "3"]) == 0
    assert calls == [60, 3]


def test_demo_prints_the_report_and_trains(capsys, one_thread):
    status = cmd.demo(epochs=1)
    out = capsys.readouterr().out
    assert status in (0, 1)
    assert out.startswith("cyback build report") and "epoch   1" in out
    assert ("OK" if status == 0 else "NOT CONVERGED") in out.splitlines()[-1]


def test_info_prints_the_build_report(capsys, monkeypatch):
    monkeypatch.setenv("CYBACK_JOIN_US", "250")
    assert cmd.main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("cyback build report")
    assert "threads" in out and "keras backend" in out and "CYBACK_JOIN_US=250" in out


def test_bench_forwards_its_arguments(tmp_path, capsys):
    import json
    row = {"suite": "ops", "case": "a", "engine": "cyback", "median_us": 100, "p90_us": 101}
    for name in ("old.json", "new.json"):
        (tmp_path / name).write_text(json.dumps({"rows": [row]}))
    assert cmd.main(["bench", "--compare", str(tmp_path / "old.json"),
                     str(tmp_path / "new.json")]) == 0
    assert "0 slower, 0 faster" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        cmd.main(["bench", "--help"])
    assert e.value.code == 0
    assert "usage: python -m cyback.bench" in capsys.readouterr().out


def test_settings_lists_values_and_checks_the_page(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CYBACK_SGEMM", "scipy")
    assert cmd.main(["settings"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("CYBACK_SGEMM"))
    assert line.split()[1:] == ["scipy", "auto"]
    page = tmp_path / "configuration.md"
    assert cmd.main(["settings", "--check-docs", str(page)]) == 1
    assert cmd.main(["settings", "--write-docs", str(page)]) == 0
    assert cmd.main(["settings", "--check-docs", str(page)]) == 0


# ------------------------------------------------------------ set-default-backend

def test_set_default_backend_creates_a_missing_file(tmp_path, capsys):
    home = tmp_path / "new" / "home"
    assert cmd.main(["set-default-backend", "--keras-home", str(home)]) == 0
    assert json.loads((home / "keras.json").read_text()) == {
        "floatx": "float32", "epsilon": 1e-07, "image_data_format": "channels_last",
        "backend": "cyback"}
    out = capsys.readouterr().out
    assert "created %s" % (home / "keras.json") in out
    assert os.listdir(home) == ["keras.json"]       # no temporary file left


def test_set_default_backend_keeps_the_other_keys(tmp_path, capsys):
    path = tmp_path / "keras.json"
    before = {"floatx": "float64", "epsilon": 1e-5, "image_data_format": "channels_first",
              "backend": "tensorflow", "custom": [1, 2]}
    path.write_text(json.dumps(before))
    os.chmod(path, 0o640)
    assert cmd.main(["set-default-backend", "--keras-home", str(tmp_path)]) == 0
    assert json.loads(path.read_text()) == dict(before, backend="cyback")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    out = capsys.readouterr().out
    assert '%s: "backend" "tensorflow" -> "cyback"' % path in out
    assert "kept custom, epsilon, floatx, image_data_format" in out
    # a second time changes nothing
    mtime = os.stat(path).st_mtime_ns
    assert cmd.main(["set-default-backend", "--keras-home", str(tmp_path)]) == 0
    assert "already selects the cyback backend; nothing changed" in capsys.readouterr().out
    assert os.stat(path).st_mtime_ns == mtime


def test_set_default_backend_follows_keras_home_and_notes_an_override(tmp_path, capsys):
    out = _run("set-default-backend", KERAS_HOME=str(tmp_path), KERAS_BACKEND="tensorflow")
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "keras.json").read_text())["backend"] == "cyback"
    assert "KERAS_BACKEND=tensorflow in this environment takes precedence" in out.stdout


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_set_default_backend_leaves_a_broken_file_alone(tmp_path, capsys, text):
    path = tmp_path / "keras.json"
    path.write_text(text)
    assert cmd.main(["set-default-backend", "--keras-home", str(tmp_path)]) == 1
    assert path.read_text() == text
    err = capsys.readouterr().err
    assert str(path) in err and "nothing was changed" in err


def test_write_atomically_cleans_up_after_a_failure(tmp_path, monkeypatch):
    def fail(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(cli.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        cli._write_atomically(str(tmp_path / "keras.json"), "{}")
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------ inspect and predict

@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    pytest.importorskip("h5py")
    try:
        from cyback.layers import import_keras
        keras = import_keras()
    except (ImportError, RuntimeError) as e:
        pytest.skip("multi-backend Keras on cyback is not available: %s" % e)
    import h5py
    folder = tmp_path_factory.mktemp("models")
    model = keras.models.Sequential([
        keras.layers.Dense(4, activation="relu", input_shape=(3,), name="hidden"),
        keras.layers.Dense(2, name="out")])
    model.save(str(folder / "m.h5"))
    # the same file as tf.keras 2.x would label it, with a layer no one provides
    shutil.copy(str(folder / "m.h5"), str(folder / "fancy.h5"))
    with h5py.File(str(folder / "fancy.h5"), "r+") as f:
        config = json.loads(f.attrs["model_config"])
        config["config"]["layers"][1]["class_name"] = "FancyLayer"
        f.attrs["model_config"] = json.dumps(config)
        f.attrs["keras_version"] = "2.15.0"
    code = keras.models.Sequential([keras.layers.Lambda(lambda t: t * 2, input_shape=(3,))])
    code.save(str(folder / "lambda.h5"))
    x = np.random.default_rng(0).random((5, 3)).astype("float32")
    np.save(str(folder / "x.npy"), x)
    return folder, model.predict(x)


def test_inspect_lists_layers_and_parameters(model_files, capsys):
    folder, _ = model_files
    assert cmd.main(["inspect", str(folder / "m.h5")]) == 0
    out = capsys.readouterr().out
    assert "HDF5, written by multi-backend Keras 2.2/2.3 (keras_version 2.3.1)" in out
    hidden = next(ln for ln in out.splitlines() if ln.split()[:1] == ["hidden"])
    assert hidden.split() == ["hidden", "Dense", "(None,", "4)", "16"]
    assert "parameters: 26 (26 trainable, 0 not)" in out
    assert "every layer is supported" in out


def test_inspect_names_every_unsupported_layer(model_files, capsys):
    folder, _ = model_files
    assert cmd.main(["inspect", str(folder / "fancy.h5")]) == 1
    captured = capsys.readouterr()
    assert "written by tf.keras / tf_keras 2.x" in captured.out
    assert "FancyLayer 'out'" in captured.err and "cannot be loaded on cyback" in captured.err


def test_inspect_refuses_code_unless_unsafe(model_files, capsys):
    folder, _ = model_files
    assert cmd.main(["inspect", str(folder / "lambda.h5")]) == 1
    assert "--unsafe" in capsys.readouterr().err
    assert cmd.main(["inspect", "--unsafe", str(folder / "lambda.h5")]) == 0
    assert "Lambda" in capsys.readouterr().out


def test_inspect_a_missing_or_foreign_file(model_files, tmp_path, capsys):
    assert cmd.main(["inspect", str(tmp_path / "none.h5")]) == 1
    assert "No such file" in capsys.readouterr().err
    (tmp_path / "text.h5").write_text("hello")
    assert cmd.main(["inspect", str(tmp_path / "text.h5")]) == 1
    assert "not a Keras model file" in capsys.readouterr().err


def test_predict_prints_or_saves_the_predictions(model_files, tmp_path, capsys):
    folder, want = model_files
    assert cmd.main(["predict", str(folder / "m.h5"), str(folder / "x.npy")]) == 0
    assert "output 0: shape (5, 2), dtype float32" in capsys.readouterr().out
    out = tmp_path / "y.npy"
    assert cmd.main(["predict", str(folder / "m.h5"), str(folder / "x.npy"), "-o", str(out),
                     "--batch-size", "2"]) == 0
    assert "wrote %s" % out in capsys.readouterr().out
    np.testing.assert_allclose(np.load(str(out)), want, rtol=1e-6, atol=1e-6)


def test_predict_refuses_an_input_of_the_wrong_shape(model_files, tmp_path, capsys):
    folder, _ = model_files
    np.save(str(tmp_path / "bad.npy"), np.zeros((4, 7), np.float32))
    assert cmd.main(["predict", str(folder / "m.h5"), str(tmp_path / "bad.npy")]) == 1
    assert "has shape (4, 7); the model takes (None, 3)" in capsys.readouterr().err
    (tmp_path / "junk.npy").write_text("junk")
    assert cmd.main(["predict", str(folder / "m.h5"), str(tmp_path / "junk.npy")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_profile_times_each_step_of_the_prediction(model_files, capsys):
    folder, want = model_files
    assert cmd.main(["profile", str(folder / "m.h5"), "--calls", "2", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "m.h5 at batch 1," in out and "the median of 2 runs" in out
    assert "a call:" in out and "steps one by one" in out
    assert "dot + add" in out                     # the Dense layer as one fused step
    assert "the 3 slowest steps:" in out or "slowest steps:" in out
    assert cmd.main(["profile", str(folder / "m.h5"), "--input", str(folder / "x.npy"),
                     "--calls", "1"]) == 0
    assert "at batch 5," in capsys.readouterr().out


def test_profile_refuses_bad_inputs(model_files, tmp_path, capsys):
    folder, _ = model_files
    np.save(str(tmp_path / "bad.npy"), np.zeros((4, 7), np.float32))
    assert cmd.main(["profile", str(folder / "m.h5"), "--input", str(tmp_path / "bad.npy")]) == 1
    assert "has shape (4, 7); the model takes (None, 3)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cmd.main(["profile", str(folder / "m.h5"), "--calls", "0"])
