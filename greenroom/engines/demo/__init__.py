"""The generated demo models and SAEs (nothing downloaded)."""
