"""The sharing strategies the planner compares, one module each; importing this package registers them."""

from gpufrac.plan.strategies import (  # noqa: F401  (imported to register)
    fractions,
    fractions_mixed,
    mig,
    replicas,
    whole_gpu,
)
from gpufrac.plan.strategies.base import STRATEGIES, Options, Strategy

__all__ = ["STRATEGIES", "Options", "Strategy"]
