"""The answer of an engine request answered whole (Embed, Score, Tokenize): one event, or its
typed error; an Embedded's vectors, unit length or cut to fewer dimensions as the embedding
routes ask, and encoded. A generation's answer goes through generation.py."""

from __future__ import annotations

import array
import math

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


def vectors(embedded: Embedded) -> list[list[float]]:
    """An Embedded's float32 vectors as lists."""
    return [array.array("f", raw).tolist() for raw in embedded.vectors]


def unit(vector: list[float]) -> list[float]:
    """`vector` scaled to length 1 (a zero vector stays as it is)."""
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else vector


def cut(vectors: list[list[float]], dimensions: int) -> list[list[float]]:
    """The first `dimensions` of each vector, at unit length again (as OpenAI's and Ollama's
    `dimensions` answer: a shortened unit vector, the way Matryoshka-trained models are read);
    vectors no longer than that are kept whole."""
    return [unit(v[:dimensions]) if 0 < dimensions < len(v) else v for v in vectors]


def vectors_answer(body: dict, headers: dict) -> Response:
    """An embedding route's answer (`body` holds its vectors as float lists), encoded by orjson:
    128 vectors of 384 floats take the stdlib's encoder ~39 ms, a front-end cost the answer pays
    beside an engine that embeds them in ~1.8 s (bench/embeddings.py), and orjson ~1.3 ms. Keys
    sorted as the app's other answers are; floats as the shortest text that reads back the same."""
    return Response(orjson.dumps(body, option=orjson.OPT_SORT_KEYS), 200, headers, mimetype="application/json")
