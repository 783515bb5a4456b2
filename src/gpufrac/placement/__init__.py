"""The placement engine: filters, scorers and GPU pickers, and `decide`.

Importing any part of the engine registers every policy (each module in `policies/` registers itself), so
`framework.POLICIES` is complete wherever it is read.
"""

from gpufrac.placement import policies  # noqa: F401
