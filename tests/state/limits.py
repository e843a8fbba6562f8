"""How long a state check waits for the pair to answer a request."""
from sparkfleet.model.watchdog import hang_seen_after_s

REQUEST_BOUND_S = 60  # a request slower than this fails the check, whatever the watchdog's settings


def request_bound_s(node) -> int:
    """60 s, or less when the watchdog already calls a pair hung sooner (it would be restarting it):
    a pair that cannot answer (a worker stopped, say) fails the check in the watchdog's time, not in
    60 s (the lab: 2 x (5 + 5) s)."""
    return min(REQUEST_BOUND_S, hang_seen_after_s(node))
