"""Anthropic's Messages surface."""
