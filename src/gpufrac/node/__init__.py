"""The node agent: NVML backends, the GPU inventory it publishes, the MPS supervisor, the watchdog, metrics.

Runs on every GPU node as a privileged DaemonSet with `hostPID` (DESIGN.md, "Delivery and enforcement on
the node"). `labels` is the one module meant for other layers: the scheduler reads what it describes.
"""
