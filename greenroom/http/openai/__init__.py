"""The OpenAI-family surfaces: chat and text completions, Responses, Needle."""
