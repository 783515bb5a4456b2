"""gpufrac: fractional GPUs with enforceable memory boundaries for Kubernetes."""

__version__ = "0.1.0"
