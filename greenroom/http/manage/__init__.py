"""greenroom's own management API: models, steering, clusters, monitoring."""
