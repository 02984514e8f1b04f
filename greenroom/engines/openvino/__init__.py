"""The OpenVINO GenAI engine."""
