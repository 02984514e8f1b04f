"""The pure pieces of embeddings: the encoder's pooling over a padded batch and how it cuts
inputs into batches (engines/transformers/pooled_batches.py), `dimensions`' cut and unit length
(http/pipeline/answering.py), and which models are embedding models (engines/embedding_models.py)."""

import json
import math
import zipfile

import numpy as np
import pytest
import torch

from greenroom.engines.embedding_models import embedding_only
from greenroom.engines.text.pooling import Pooling, max_seq_length
from greenroom.engines.transformers.pooled_batches import BATCH_TOKENS, batches, pool
from greenroom.http.pipeline.answering import cut, unit

# two rows, the second padded after its two tokens (the padding's states are garbage: 100)
HIDDEN = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [5.0, 0.0]], [[2.0, 2.0], [4.0, -2.0], [100.0, 100.0]]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


@pytest.mark.parametrize(
    "mode,want",
    [
        ("mean", [[3.0, 2.0], [3.0, 0.0]]),
        ("cls", [[1.0, 2.0], [2.0, 2.0]]),
        ("max", [[5.0, 4.0], [4.0, 2.0]]),
        ("lasttoken", [[5.0, 0.0], [4.0, -2.0]]),
    ],
)
def test_pooling_reads_only_the_unpadded_positions(mode, want):
    assert pool(HIDDEN, MASK, Pooling(mode, False, True)).tolist() == want


def test_normalize_makes_unit_vectors_in_the_pooled_direction():
    got = pool(HIDDEN, MASK, Pooling("mean", True, True)).tolist()
    assert got[0] == pytest.approx([3 / math.sqrt(13), 2 / math.sqrt(13)]) and got[1] == pytest.approx([1.0, 0.0])


def test_128_inputs_of_40_tokens_run_as_one_batch_and_long_ones_are_cut():
    assert batches([40] * 128, BATCH_TOKENS) == [list(range(128))]
    long = batches([256] * 100, BATCH_TOKENS)
    assert [len(b) for b in long] == [32, 32, 32, 4]


def test_batches_go_shortest_first_and_keep_every_index_once():
    lengths = [9, 1, 5, 3, 7]
    got = batches(lengths, 10)
    assert sorted(i for b in got for i in b) == list(range(5))
    assert all(len(b) * max(lengths[i] for i in b) <= 10 or len(b) == 1 for b in got)
    assert got[0][0] == 1  # the shortest first


def test_dimensions_cut_and_renormalise_and_keep_what_they_cannot_cut():
    v = [3.0, 4.0, 12.0]
    rows = np.array([v])
    assert cut(rows, 2).tolist() == [[0.6, 0.8]]
    assert cut(rows, 3).tolist() == [v] and cut(rows, 5).tolist() == [v] and cut(rows, 0).tolist() == [v]
    assert unit(rows)[0].tolist() == pytest.approx([3 / 13, 4 / 13, 12 / 13])
    assert unit(np.array([[0.0, 0.0], [0.0, 2.0]])).tolist() == [[0.0, 0.0], [0.0, 1.0]]


def test_embedding_models_are_told_by_their_files(tmp_path):
    st = tmp_path / "st"
    st.mkdir()
    (st / "modules.json").write_text("[]")
    (st / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256}))
    encoder, causal = tmp_path / "enc", tmp_path / "lm"
    for folder, arch in ((encoder, "BertModel"), (causal, "LlamaForCausalLM")):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"architectures": [arch]}))
    zipped = tmp_path / "pkg" / "model.zip"
    zipped.parent.mkdir()
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("modules.json", "[]")
    cache = str(tmp_path / "cache")
    assert embedding_only(str(st), cache) and embedding_only(str(encoder), cache)
    assert embedding_only(f"unpacked:{zipped}", cache)  # not unpacked yet: its zip says
    assert not embedding_only(str(causal), cache) and not embedding_only(str(tmp_path / "absent"), cache)
    assert max_seq_length(st) == 256 and max_seq_length(encoder) is None
