"""The live tier: real `greenroom serve` processes, real SDKs, real models."""
