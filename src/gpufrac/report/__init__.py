"""`gpufrac report`: the densification a cluster achieves today, read from the cluster and its agents."""
