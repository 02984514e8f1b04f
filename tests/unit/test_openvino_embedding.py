"""The OpenVINO engine's embedding pieces that compute nothing: how a request's texts are cut
into TextEmbeddingPipeline calls (text_embedding.calls), the pooling it can honour, and which
folders are exported to IR, where, and when again (encoder_export.py), on folders written here."""

import json
import os

import pytest

from greenroom.engines.openvino.encoder_export import export_marker, is_encoder_checkpoint, openvino_dir
from greenroom.engines.openvino.text_embedding import BATCH, TextEmbedder, calls
from greenroom.engines.text.pooling import Pooling


def test_static_shapes_run_batch_rows_a_call_and_a_lone_text_alone():
    assert calls(2 * BATCH + 4, static=True) == [
        (0, BATCH, BATCH),
        (BATCH, 2 * BATCH, BATCH),
        (2 * BATCH, 2 * BATCH + 4, BATCH),
    ]
    assert calls(BATCH, static=True) == [(0, BATCH, BATCH)]
    assert calls(1, static=True) == [(0, 1, 1)]


def test_dynamic_shapes_run_up_to_batch_texts_a_call():
    assert calls(BATCH + 1, static=False) == [(0, BATCH, None), (BATCH, BATCH + 1, None)]
    assert calls(1, static=False) == [(0, 1, None)]


def test_max_pooling_is_refused_before_any_pipeline(tmp_path):
    with pytest.raises(ValueError, match="max"):
        TextEmbedder(tmp_path, "CPU", {}, Pooling("max", True, True))


def _checkpoint(folder, modules=True):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    if modules:
        (folder / "modules.json").write_text("[]")
    return folder


def test_a_sentence_transformers_checkpoint_is_exported_and_an_ir_is_not(tmp_path):
    assert is_encoder_checkpoint(_checkpoint(tmp_path / "st"))
    assert not is_encoder_checkpoint(_checkpoint(tmp_path / "causal", modules=False))
    ir = _checkpoint(tmp_path / "ir")
    (ir / "openvino_model.xml").write_text("")
    assert not is_encoder_checkpoint(ir)
    assert not is_encoder_checkpoint(tmp_path / "st" / "config.json")


def test_each_checkpoint_path_has_its_own_ir_folder(tmp_path):
    a, b = _checkpoint(tmp_path / "a"), tmp_path / "b"
    b.mkdir()
    same_name = _checkpoint(b / "a")
    cache = tmp_path / "cache"
    assert openvino_dir(cache, a) == openvino_dir(cache, a) != openvino_dir(cache, same_name)
    assert openvino_dir(cache, a).parent == cache / "openvino"


def test_the_marker_changes_with_the_checkpoints_files(tmp_path):
    ckpt = _checkpoint(tmp_path / "st")
    marker = export_marker(ckpt)
    assert set(marker["files"]) == {"config.json", "modules.json"} and marker["converter_version"] >= 1
    assert export_marker(ckpt) == marker
    os.utime(ckpt / "config.json", ns=(1, 1))
    assert export_marker(ckpt) != marker
