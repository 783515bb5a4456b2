"""Test doubles shared by the tests and the benchmarks: fake GPU nodes for a cluster without kubelets, and a
fake host (/proc, cgroups, NVML processes) for the node agent. No program imports this package (an
import-linter contract checks it)."""
