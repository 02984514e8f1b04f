"""The one generation pipeline every surface shares: a typed request in, one typed event stream out."""
