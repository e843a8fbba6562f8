"""The exit status of every `sparkfleet` command, in one place (docs/operations.md#exit-status).

`plan` keeps `terraform plan -detailed-exitcode`'s meaning (0 nothing to change, 1 error, 2 changes),
and every other command means the same by the same number: 0 done (or nothing to change), 1 not done
(bad input refused, a failed run or check, a deploy not confirmed), 2 only ever "a deploy would change
something". A usage error, which argparse exits with 2, exits 1 too, so a script reading 2 from
`sparkfleet plan` never takes a typo for a plan with changes. (make turns any failing command's status
into its own 2: a script that reads the status runs `sparkfleet` itself.)
"""
OK = 0  # done; for plan and deploy also: nothing to change
FAILED = 1  # not done: refused input, a failed run or check, no plan, a deploy not confirmed, bad usage
CHANGES = 2  # plan only: a deploy would change something


def normalised(returncode: int) -> int:
    """A command's exit status (pyinfra's: 0, 1, or click's 2 for a usage error) as sparkfleet's own."""
    return OK if returncode == 0 else FAILED
