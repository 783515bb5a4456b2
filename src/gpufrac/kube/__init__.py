"""Everything that talks to the Kubernetes API: scheduler loop, webhook, leader election, metrics."""
