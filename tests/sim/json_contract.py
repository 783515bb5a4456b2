"""The JSON document `gpufrac simulate --format json` prints, as the issue defines it: written once here
and checked both on `summarize` and on the command's output."""

SUMMARY_KEYS = {"trace", "gpus", "seeds", "policies"}
# Per policy, besides `published_at_100` for the paper's six.
POLICY_KEYS = {
    "allocation",
    "allocation_at_100",
    "allocation_at_100_std",
    "unallocated_at_100",
    "fragmentation_at_100",
    "failed_pods",
    "seconds",
}
