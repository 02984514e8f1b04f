"""The HTTP front end (quart-trio on hypercorn). Never imports torch or any engine."""
