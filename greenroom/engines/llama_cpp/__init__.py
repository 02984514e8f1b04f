"""The llama.cpp engine and the GGUF tooling around it."""
