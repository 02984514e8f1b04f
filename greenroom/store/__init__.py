"""SQLite persistence (steering profiles, clusters, circuits, pulled models)."""
