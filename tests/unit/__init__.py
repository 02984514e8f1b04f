"""The unit tier: pure functions and objects, no process, no server, no model weights; seconds (`make test-fast`)."""
