"""examples/: each script runs to the end (exit status 0) in its own process
and says what it checked. They are small: seconds each."""
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"

# script -> (modules it needs, a line it prints when its check passed)
SCRIPTS = {
    "train_save_reload.py": (("keras", "h5py"),
                             "cyback.load_model: the reloaded model's 100 predictions are "
                             "identical"),
    "serve_thread_pool.py": (("keras", "h5py"),
                             "served 64 requests; 0 answers differ"),
    "dask_batch_scoring.py": (("keras", "h5py", "dask", "distributed"),
                              "the cluster's predictions match the model run directly"),
}


# Examples whose first half needs TensorFlow: run where CYBACK_TF_PYTHON names a
# Python that has it (never in CI, which has no TensorFlow).
TF_SCRIPTS = {
    "serve_tf_keras_model.py": "predictions match the training",
}


def test_every_example_is_tested():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(set(SCRIPTS) | set(TF_SCRIPTS))


@pytest.mark.parametrize("script", sorted(TF_SCRIPTS))
def test_tf_example_runs(script, tmp_path):
    tf_python = os.environ.get("CYBACK_TF_PYTHON")
    if not tf_python:
        pytest.skip("%s trains with TensorFlow: set CYBACK_TF_PYTHON to a Python that has it"
                    % script)
    env = dict(os.environ, KERAS_HOME=str(tmp_path / "keras-home"), KERAS_BACKEND="cyback")
    out = subprocess.run([sys.executable, str(EXAMPLES / script), "--tf-python", tf_python],
                         env=env, cwd=str(tmp_path), capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert TF_SCRIPTS[script] in out.stdout, out.stdout


def test_tf_example_explains_what_it_needs(tmp_path):
    out = subprocess.run([sys.executable, str(EXAMPLES / "serve_tf_keras_model.py")],
                         cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "give --tf-python" in out.stderr


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_example_runs(script, tmp_path):
    needs, says = SCRIPTS[script]
    for module in needs:
        if importlib.util.find_spec(module) is None:
            pytest.skip("%s needs %s" % (script, module))
    # Keras writes keras.json on its first import: into a folder of the test's own
    env = dict(os.environ, KERAS_HOME=str(tmp_path / "keras-home"), KERAS_BACKEND="cyback")
    out = subprocess.run([sys.executable, str(EXAMPLES / script)], env=env, cwd=str(tmp_path),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert says in out.stdout, out.stdout
    # the scripts clean up after themselves and write nothing where they run
    assert sorted(os.listdir(tmp_path)) in ([], ["keras-home"])


def test_the_dask_quickstart_of_the_docs_runs_as_written(tmp_path):
    for module in ("keras", "h5py", "dask", "distributed"):
        if importlib.util.find_spec(module) is None:
            pytest.skip("the quickstart needs %s" % module)
    text = (EXAMPLES.parent / "docs" / "dask.md").read_text(encoding="utf-8")
    section = text.split("## On your machine: a local cluster")[1]
    code = section.split("```python\n")[1].split("```")[0]
    (tmp_path / "quickstart.py").write_text(code)
    env = dict(os.environ, KERAS_HOME=str(tmp_path / "keras-home"))
    out = subprocess.run([sys.executable, "quickstart.py"], env=env, cwd=str(tmp_path),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "scored 1000 images" in out.stdout and "1000 rows read back" in out.stdout
