"""Pure compute: every engine behind one protocol. Never imports trio, tractor or quart."""
