"""Text around generation, the same for every engine: chat templates, tool-call syntax, constraints, stops, detokenising."""
