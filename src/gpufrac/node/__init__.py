"""The node agent: NVML backends, the GPU inventory it publishes, the MPS supervisor, the watchdog, metrics.

Runs on every GPU node as a privileged DaemonSet with `hostPID` (docs/architecture.md, "How a pod flows").
It shares only the contract (the inventory format it publishes is `contract.node_inventory`) and
`kubeapi` with the rest of gpufrac: an import-linter contract keeps it apart from the scheduler and the
engine.
"""
