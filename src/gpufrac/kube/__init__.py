"""Everything that talks to the Kubernetes API: scheduler loop, leader election, metrics."""
