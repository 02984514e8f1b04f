"""The transformers engine: its decode loop, batching, fixed-shape steps, prefix reuse, sampling."""
