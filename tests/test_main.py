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
