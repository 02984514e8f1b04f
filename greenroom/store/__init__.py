"""SQLite persistence: the registry of pulled, copied and created models; the steering state and profiles."""
