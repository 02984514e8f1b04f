"""The field ledger's rules read from the request declarations (contracts.py): each endpoint's
table is derived from its Shape, and is what the hand-kept tables held."""

import pytest

from greenroom.http import ledger, ollama_api, ollama_embed, ollama_models, openapi

# each ledger-checked request component, and the table that checked it before the rules moved
_TABLES = {
    "ChatCompletionRequest": ledger.CHAT,
    "CompletionRequest": ledger.COMPLETIONS,
    "EmbeddingRequest": ledger.EMBEDDINGS,
    "ResponseRequest": ledger.RESPONSES,
    "MessageRequest": ledger.MESSAGES,
    "MessageCountTokensRequest": ledger.COUNT_TOKENS,
    "TokenizeRequest": ledger.TOKENIZE,
    "DetokenizeRequest": ledger.DETOKENIZE,
    "OllamaGenerateRequest": ollama_api.GENERATE,
    "OllamaChatRequest": ollama_api.CHAT,
    "OllamaShowRequest": ollama_api.SHOW,
    "OllamaEmbedRequest": ollama_embed.EMBED,
    "OllamaEmbeddingsRequest": ollama_embed.EMBEDDINGS,
    "OllamaPullRequest": ollama_models.PULL,
    "OllamaDeleteRequest": ollama_models.DELETE,
    "OllamaCopyRequest": ollama_models.COPY,
    "OllamaCreateRequest": ollama_models.CREATE,
}


@pytest.mark.parametrize("name", sorted(_TABLES))
def test_derived_table_is_the_hand_kept_one(name):
    shape = openapi._REQUESTS[name]
    assert shape.ledger
    assert {field: f.rule for field, f in shape.fields.items()} == _TABLES[name]
