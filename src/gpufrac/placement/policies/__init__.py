"""Placement policies, one module each; importing this package registers them all by name."""

from gpufrac.placement.policies import (  # noqa: F401  (imported to register)
    bestfit,
    binpack,
    clustering,
    dotprod,
    fgd,
    packing,
    random,
)
