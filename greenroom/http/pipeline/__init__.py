"""The one generation pipeline every surface runs: translators in front, formatters behind."""
