"""roles/fingerprint: every node of a group on the same kernel, GPU driver, CX7 firmware and Docker.

Read-only, at prepare: one fact per node, a table and a refusal when the nodes differ on a field
data marks as must-match (fingerprint_must_match), before any operation runs.
"""
from pyinfra import state

from roles.fingerprint.checks import check_fingerprint

# 1. One fingerprint per node, compared across the group once per deploy.
check_fingerprint(state)
