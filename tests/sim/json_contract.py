"""The JSON document `gpufrac simulate --format json` prints, as the issue defines it: written once here
and checked both on `summarize` and on the command's output."""

SUMMARY_KEYS = {"trace", "gpus", "inflation", "seeds", "policies", "bound"}
# Only where some run did not reach 100% arrival: the arrival points its figures "at 100" were read at.
READ_ELSEWHERE_KEY = "read_at_arrival"
# Per policy, besides `published_at_100` for the paper's six.
POLICY_KEYS = {
    "allocation",
    "allocation_at_100",
    "allocation_at_100_std",
    "unallocated_at_100",
    "fragmentation_at_100",
    "failed_pods",
    "seconds",
    "gap_to_bound",
}
# Per policy variant with a move budget (`--move-budget`): what moving cost by 100% arrival.
MOVE_KEYS = {"move_budget", "moves_at_100", "moves_per_100_arrivals", "moved_gpu_seconds_at_100"}
# Per policy variant with a whole-GPU reserve (`--whole-gpu-reserve`): the large shares it turned away.
RESERVE_KEYS = {"whole_gpu_reserve", "kept_out_at_100"}
# The upper bound at 100% arrival: the mean, each seed's, and the LP's size and solve time.
BOUND_KEYS = {"allocation_at_100", "per_seed", "variables", "constraints", "seconds"}
