"""The answer of an engine request answered whole (Embed, Score, Tokenize): one event, or its
typed error; an Embedded's vectors, unit length or cut to fewer dimensions as the embedding
routes ask, and encoded. A generation's answer goes through generation.py."""

from __future__ import annotations

import numpy as np
import orjson
from quart import Response

from greenroom.errors import GreenroomError
from greenroom.protocol import Embedded, Failed
from greenroom.supervisor.engine_client import EngineClient


async def single(client: EngineClient, message):
    """The one answer of a request that is answered whole (Embed, Score), or its typed error."""
    async with client.submit(message) as events:
        async for event in events:
            if isinstance(event, Failed):
                raise GreenroomError.from_wire(event.error)
    return event


def vectors(embedded: Embedded) -> np.ndarray:
    """An Embedded's vectors, a row each, float32 as the engine made them. As arrays, not lists:
    unit length and the answer's encoding over 128 vectors of 384 floats took the front end ~6 ms
    in Python, ~1.5 so (bench/embeddings.py)."""
    return np.frombuffer(b"".join(embedded.vectors), "<f4").reshape(len(embedded.vectors), -1)


def unit(rows: np.ndarray) -> np.ndarray:
    """Each row scaled to length 1 in its own precision (Ollama normalises float32 vectors as
    float32); a zero row stays as it is."""
    norms = np.linalg.norm(rows, axis=-1, keepdims=True)
    return np.divide(rows, norms, out=rows.copy(), where=norms > 0)


def cut(rows: np.ndarray, dimensions: int) -> np.ndarray:
    """The first `dimensions` of each row, at unit length again (as OpenAI's and Ollama's
    `dimensions` answer: a shortened unit vector, the way Matryoshka-trained models are read);
    rows no longer than that are kept whole."""
    return unit(rows[:, :dimensions]) if 0 < dimensions < rows.shape[-1] else rows


def vectors_answer(body: dict, headers: dict) -> Response:
    """An embedding route's answer (`body` holds its vectors as arrays: `vectors`), encoded by orjson:
    128 vectors of 384 floats take the stdlib's encoder ~39 ms, a front-end cost the answer pays
    beside an engine that embeds them in ~1.8 s (bench/embeddings.py), and orjson ~1.3 ms. Keys
    sorted as the app's other answers are; floats as the shortest text that reads back the same
    float32 (an array of them: half the bytes of float64's digits) or float (a list's)."""
    return Response(
        orjson.dumps(body, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY),
        200,
        headers,
        mimetype="application/json",
    )
