"""Actor entry points: glue between stream messages and engines. Each module here is
imported by a child process first thing, so it stays light (no torch at import)."""
