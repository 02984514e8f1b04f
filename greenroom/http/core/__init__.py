"""The front end's core: what every surface shares (header names, …)."""
