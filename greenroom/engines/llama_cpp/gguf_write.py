"""The last step of every GGUF file greenroom writes (the demo's, a BERT checkpoint's): a
`gguf.GGUFWriter` with its keys and tensors added, written out readable by every process."""

from __future__ import annotations

import os
from pathlib import Path


def write_file(writer, out: Path) -> Path:
    """Write `writer`'s header, key/values and tensors to `out` (the path it was made with)."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.chmod(out, 0o644)
    return Path(out)
