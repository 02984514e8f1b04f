"""Engine actors on other machines: the authenticated link between a worker host and the main one."""
