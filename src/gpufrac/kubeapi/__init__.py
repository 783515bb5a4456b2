"""What every gpufrac program that talks to the Kubernetes API shares: the client and its errors, the
reflector, Events, and the probe routes. Nothing here knows about GPUs or the contract."""
