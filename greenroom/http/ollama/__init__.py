"""The Ollama /api surface."""
