"""require_checkpoint_dir, require_image_processor_config and the workers' start-up checks, on tiny directories."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from epd.models.errors import MissingImageProcessorError, ModelLoadError
from epd.models.processor_files import require_checkpoint_dir, require_image_processor_config


def _checkpoint(tmp_path, **files):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "kimi_k25"}))
    for name, content in files.items():
        (tmp_path / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return tmp_path


def test_classic_preprocessor_config(tmp_path):
    root = _checkpoint(tmp_path, **{"preprocessor_config.json": {"image_processor_type": "X"}})
    assert require_image_processor_config(root) == tmp_path / "preprocessor_config.json"


def test_classic_preferred_over_combined(tmp_path):
    root = _checkpoint(
        tmp_path,
        **{"preprocessor_config.json": {}, "processor_config.json": {"image_processor": {}}},
    )
    assert require_image_processor_config(str(root)) == tmp_path / "preprocessor_config.json"


def test_combined_processor_config_with_image_processor(tmp_path):
    root = _checkpoint(tmp_path, **{"processor_config.json": {"image_processor": {"patch_size": 14}}})
    assert require_image_processor_config(str(root)) == tmp_path / "processor_config.json"


def test_combined_without_image_processor_key(tmp_path):
    root = _checkpoint(tmp_path, **{"processor_config.json": {"processor_class": "P"}})
    with pytest.raises(MissingImageProcessorError) as excinfo:
        require_image_processor_config(root)
    message = str(excinfo.value)
    assert str(tmp_path) in message
    assert "preprocessor_config.json" in message
    assert "processor_config.json" in message


def test_no_processor_files_at_all(tmp_path):
    root = _checkpoint(tmp_path)
    with pytest.raises(MissingImageProcessorError) as excinfo:
        require_image_processor_config(root)
    assert str(tmp_path) in str(excinfo.value)
    assert "preprocessor_config.json" in str(excinfo.value)


def test_missing_image_processor_is_a_model_load_error():
    assert issubclass(MissingImageProcessorError, ModelLoadError)


def test_no_config_json(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text("{}")
    with pytest.raises(ModelLoadError) as excinfo:
        require_image_processor_config(tmp_path)
    assert not isinstance(excinfo.value, MissingImageProcessorError)
    assert str(tmp_path) in str(excinfo.value)
    assert "config.json" in str(excinfo.value)


def test_nonexistent_directory(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ModelLoadError) as excinfo:
        require_image_processor_config(missing)
    assert str(missing) in str(excinfo.value)


def test_invalid_json_processor_config(tmp_path):
    root = _checkpoint(tmp_path, **{"processor_config.json": "{not json"})
    with pytest.raises(ModelLoadError) as excinfo:
        require_image_processor_config(root)
    assert not isinstance(excinfo.value, MissingImageProcessorError)
    assert str(tmp_path / "processor_config.json") in str(excinfo.value)


def test_load_encoder_fails_before_loading_a_model(tmp_path):
    from epd.models.loading import load_encoder

    root = _checkpoint(tmp_path)
    with pytest.raises(MissingImageProcessorError) as excinfo:
        load_encoder(root)
    assert str(tmp_path) in str(excinfo.value)
    assert "preprocessor_config.json" in str(excinfo.value)


def test_checkpoint_dir_needs_config_json(tmp_path):
    assert require_checkpoint_dir(str(_checkpoint(tmp_path))) == tmp_path
    with pytest.raises(ModelLoadError, match="config.json is missing") as excinfo:
        require_checkpoint_dir(tmp_path / "gone")
    assert str(tmp_path / "gone") in str(excinfo.value)


# A supervisor restarting a worker whose checkpoint went away would otherwise pay torch's and
# transformers' import (seconds) on every try before hearing why.
_RUN_ROLE = """
import sys
from epd.cli import main
code = main([sys.argv[1], "--model", sys.argv[2]])
print(code, "torch" in sys.modules)
"""


@pytest.mark.parametrize("role", ["encoder", "prefill", "decode", "colocated", "router"])
def test_every_process_refuses_a_missing_checkpoint_before_importing_torch(role, tmp_path):
    missing = tmp_path / "gone"
    done = subprocess.run([sys.executable, "-c", _RUN_ROLE, role, str(missing)],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["1", "False"], done.stdout + done.stderr
    assert f"epd {role}: {missing}: not a checkpoint directory" in done.stderr
