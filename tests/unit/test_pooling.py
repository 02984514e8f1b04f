"""The pooling a checkpoint asks for (engines/text/pooling.py) and the unpacked zip source
(engines/unpacked.py), on folders written here."""

import json
import zipfile

import pytest

from greenroom.engines.loader import resolve_source, source_path
from greenroom.engines.text.pooling import MEAN, Pooling, read_pooling

ST = "sentence_transformers.models."


def _checkpoint(tmp_path, modules, pooling=None):
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (tmp_path / "1_Pooling").mkdir()
        (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return tmp_path


def _modules(*types):
    paths = {"Pooling": "1_Pooling", "Normalize": "2_Normalize"}
    return [{"idx": i, "path": paths.get(t, ""), "type": ST + t} for i, t in enumerate(types)]


@pytest.mark.parametrize(
    "key,mode",
    [("pooling_mode_mean_tokens", "mean"), ("pooling_mode_cls_token", "cls"), ("pooling_mode_lasttoken", "lasttoken")],
)
def test_the_pooling_module_picks_the_mode_and_normalize_follows(tmp_path, key, mode):
    ckpt = _checkpoint(tmp_path, _modules("Transformer", "Pooling", "Normalize"), {key: True})
    assert read_pooling(ckpt) == Pooling(mode, True, True)


def test_a_causal_lm_without_modules_json_pools_by_the_mean_unnormalised(tmp_path):
    assert read_pooling(tmp_path) == MEAN and not MEAN.normalize


def test_without_normalize_the_vectors_stay_as_pooled(tmp_path):
    ckpt = _checkpoint(tmp_path, _modules("Transformer", "Pooling"), {"pooling_mode_cls_token": True})
    assert read_pooling(ckpt) == Pooling("cls", False, True)


@pytest.mark.parametrize(
    "config",
    [
        {"pooling_mode_mean_sqrt_len_tokens": True},
        {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True},
        {},
    ],
)
def test_a_pooling_it_cannot_honour_is_refused(tmp_path, config):
    with pytest.raises(ValueError, match="pooling"):
        read_pooling(_checkpoint(tmp_path, _modules("Transformer", "Pooling"), config))


def test_a_zip_source_unpacks_once_where_source_path_says(tmp_path):
    zip_file = tmp_path / "pkg" / "model.zip"
    zip_file.parent.mkdir()
    with zipfile.ZipFile(zip_file, "w") as archive:
        archive.writestr("config.json", "{}")
    source = f"unpacked:{zip_file}"
    out = resolve_source(source, str(tmp_path / "cache"))
    assert out == source_path(source, str(tmp_path / "cache")) and (out / "config.json").read_text() == "{}"
    assert resolve_source(source, str(tmp_path / "cache")) == out


def test_a_zip_with_a_member_outside_its_folder_is_refused(tmp_path):
    from greenroom.engines.base import EngineError

    zip_file = tmp_path / "evil.zip"
    with zipfile.ZipFile(zip_file, "w") as archive:
        archive.writestr("../escaped.json", "{}")
    with pytest.raises(EngineError, match="outside"):
        resolve_source(f"unpacked:{zip_file}", str(tmp_path / "cache"))
    assert not (tmp_path / "cache" / "escaped.json").exists()
