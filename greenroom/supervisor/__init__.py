"""Tree lifecycle and the model registry: who holds which model, in which state."""
