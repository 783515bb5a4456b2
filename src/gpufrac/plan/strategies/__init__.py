"""The sharing strategies the planner compares, one module each; importing this package registers them.

The imports are in registration order, which is the order of `STRATEGIES` and of every plan's report:
from no sharing to the most.
"""

# isort: off
from gpufrac.plan.strategies import (  # noqa: F401  (imported to register)
    whole_gpu,
    replicas,
    mig,
    fractions,
    fractions_mixed,
)

# isort: on
from gpufrac.plan.strategies.base import STRATEGIES, Options, Strategy

__all__ = ["STRATEGIES", "Options", "Strategy"]
