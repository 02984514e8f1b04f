"""GGUF metadata without loading the model: the header reader (engines/llama_cpp/gguf_meta.py) against
the `gguf` package's full reader on written files of every value type, split models counted
whole, and rendering that no stored value can break (tests/live/test_gguf_metadata.py: the
reader on the demo files and SmolLM2's, and the Ollama read routes)."""

from __future__ import annotations

import datetime
import json
import math

import gguf
import numpy as np
from gguf_reference import agrees
from hypothesis import given, settings
from hypothesis import strategies as st

from greenroom.engines.capabilities import ENGINES
from greenroom.engines.llama_cpp import gguf_meta
from greenroom.http.ollama import model_facts
from greenroom.supervisor.placements import Placement


def test_a_big_endian_file_and_every_value_type(tmp_path):
    for endian in (gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG):
        path = tmp_path / f"{endian.name}.gguf"
        w = gguf.GGUFWriter(path, "llama", endianess=endian)
        w.add_uint8("t.u8", 7)
        w.add_int8("t.i8", -7)
        w.add_uint16("t.u16", 65535)
        w.add_int16("t.i16", -300)
        w.add_uint32("t.u32", 2**32 - 1)
        w.add_int32("t.i32", -(2**31))
        w.add_float32("t.f32", 1e-5)
        w.add_uint64("t.u64", 2**64 - 1)
        w.add_int64("t.i64", -(2**63))
        w.add_float64("t.f64", math.pi)
        w.add_bool("t.bool", True)
        w.add_string("t.str", "héllo")
        w.add_array("t.small", [1, 2, 3])
        w.add_array("t.strings", [f"tok{i}" for i in range(gguf_meta.MAX_ARRAY + 1)])
        w.add_array("t.floats", [0.5] * (gguf_meta.MAX_ARRAY + 5))
        w.add_tensor("a", np.zeros((3, 5), dtype=np.float32))
        w.add_tensor("b", np.zeros(7, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        agrees(path)
        assert gguf_meta.read(path).parameters == 22


def test_nested_arrays_keep_their_shape(tmp_path):
    path = tmp_path / "nested.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_array("t.nested", [[1, 2], [3, 4, 5]])
    w.add_array("t.long", [[i, i] for i in range(gguf_meta.MAX_ARRAY + 1)])
    w.add_uint32("t.after", 7)  # read from where the stepped-over array ends
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    meta = gguf_meta.read(path)
    assert meta.fields["t.nested"] == [[1, 2], [3, 4, 5]] and meta.fields["t.after"] == 7
    assert gguf_meta.read_array(path, meta, meta.fields["t.long"])[-1] == [gguf_meta.MAX_ARRAY] * 2


def test_a_split_model_is_counted_over_all_its_files(tmp_path):
    parts = [tmp_path / f"big-Q8_0-0000{i}-of-00002.gguf" for i in (1, 2)]
    for i, path in enumerate(parts):
        w = gguf.GGUFWriter(path, "llama")
        w.add_uint16("split.no", i)
        w.add_uint16("split.count", 2)
        w.add_tensor(f"t{i}", np.zeros((10, 10 * (i + 1)), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    placed = model_facts.Placed("big:Q8_0", Placement("big:Q8_0", str(parts[0]), "llama.cpp", "cpu"), None)
    (row,) = model_facts.tags([placed])
    assert row["size"] == sum(p.stat().st_size for p in parts) and row["details"]["parameter_size"] == "300"
    assert model_facts.show(placed, ENGINES["llama.cpp"], False)["model_info"]["general.parameter_count"] == 300
    parts[1].unlink()  # a part missing: no count rather than the first part's alone
    (row,) = model_facts.tags([placed])
    assert row["size"] == parts[0].stat().st_size and row["details"]["parameter_size"] == ""


def test_file_type_labels_are_ggufs():
    assert gguf_meta.FILE_TYPES == {
        t.value: t.name.removeprefix("MOSTLY_").removeprefix("ALL_") for t in gguf.LlamaFileType
    }


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**80), 2**80) | st.none())
def test_timestamps_render_from_any_number(ts):
    text = model_facts.rfc3339(ts)
    assert datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).tzinfo is not None


@settings(max_examples=100, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True) | st.none())
def test_a_running_model_renders_whatever_its_deadline(left):
    placed = model_facts.Placed("m", Placement("m", "/no/such/model.gguf", "llama.cpp", "cpu"), None, left)
    (row,) = model_facts.ps([placed])
    json.dumps(row, allow_nan=False)
    datetime.datetime.fromisoformat(row["expires_at"].replace("Z", "+00:00"))
