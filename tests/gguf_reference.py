"""The check both tiers run on a GGUF file: the header reader (engines/llama_cpp/gguf_meta.py) agrees with
the `gguf` package's full reader."""

from __future__ import annotations

from pathlib import Path

import gguf

from greenroom.engines.llama_cpp import gguf_files, gguf_meta


def expected_label(reader: gguf.GGUFReader) -> str:
    field = reader.fields.get("general.file_type")
    return (
        "F32"
        if field is None
        else gguf.LlamaFileType(field.contents()).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    )


def agrees(path: Path) -> None:
    reader = gguf.GGUFReader(path)
    meta = gguf_meta.read(path)
    fields = {name: f for name, f in reader.fields.items() if not name.startswith("GGUF.")}
    assert list(meta.fields) == list(fields)  # every key, in the file's order
    for name, field in fields.items():
        value = meta.fields[name]
        if field.types[0] == gguf.GGUFValueType.ARRAY and len(field.data) > gguf_meta.MAX_ARRAY:
            assert isinstance(value, gguf_meta.Skipped), name  # stepped over, its length kept
            assert (value.type, value.count) == (field.types[-1], len(field.data))
            assert gguf_meta.read_array(path, meta, value) == field.contents()  # and read on demand
        else:
            assert value == field.contents() and type(value) is type(field.contents()), name
    assert meta.version == reader.fields["GGUF.version"].contents()
    assert meta.tensor_count == len(reader.tensors)
    assert meta.parameters == sum(int(t.n_elements) for t in reader.tensors)
    assert gguf_files.quant_label(path) == expected_label(reader)
