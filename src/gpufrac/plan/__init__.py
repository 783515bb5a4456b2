"""The capacity planner: one workload replayed under each GPU sharing strategy (`gpufrac plan`)."""
