"""Placement policies, one module each; importing this package registers them all by name.

The imports are in registration order, which is the order of `framework.POLICIES`: the order in which
`gpufrac simulate --policies all` runs and reports them.
"""

# isort: off
from gpufrac.placement.policies import (  # noqa: F401  (imported to register)
    bestfit,
    binpack,
    spread,
    clustering,
    dotprod,
    fgd,
    fgd_stranding,
    packing,
    random,
)
# isort: on
