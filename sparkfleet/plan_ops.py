"""Which of a host's operations a deploy would run, judged at the end of prepare (`sparkfleet plan`).

pyinfra's own change detection (a run without -y) generates every operation's commands at prepare,
reading each operation's facts one after the other: on the lab that doubled the time of the
deploy's prepare (files.put alone is three facts per file). The deploy's operations are nearly all
gated instead (`_if=`): on a plan verdict, on sparkfleet.unchanged's one reading per host of every
file and unit it manages, or on an earlier operation's change. So a plan runs the deploy with
`-y --dry` (prepare only, no change detection) and judges each operation here, from what it
declared:

- a condition that is false: the operation would not run;
- a condition that needs an earlier operation's result (`did_change()` before execution raises,
  pyinfra/api/operation.py `_raise_if_not_complete`): it runs only if that one changes, which the
  plan shows by itself; counted apart, never as a change;
- every condition true: it would run;
- no condition: pyinfra's own verdict, its commands generated now as change detection would
  (command_generator does not look at `_if` before execution).
"""
from __future__ import annotations

WOULD_RUN, ONLY_IF, NOT_RUN = "would run", "only if an earlier step changes", "not run"


def _conditions(global_arguments: dict) -> list:
    ifs = global_arguments.get("_if")
    if isinstance(ifs, list):
        return ifs
    return [ifs] if callable(ifs) else []


def judge(conditions: list, generate) -> str:
    """One operation's verdict from its conditions (called in order, as pyinfra calls them) and,
    without any, from `generate()`: its command generator."""
    unknown = False
    for condition in conditions:
        try:
            if not condition():
                return NOT_RUN
        except RuntimeError:  # an earlier operation's result: not known before it runs
            unknown = True
    if unknown:
        return ONLY_IF
    if conditions:
        return WOULD_RUN
    commands = iter(generate())
    try:
        return WOULD_RUN if next(commands, None) is not None else NOT_RUN
    finally:
        # closed at once: pyinfra's generator marks the host as inside an operation until it ends
        close = getattr(commands, "close", None)
        if close:
            close()


def host_operations(state, host) -> list[dict]:
    """[{"names": [...], "verdict": ...}] for every operation declared on `host`, in order."""
    out = []
    order = {op_hash: i for i, op_hash in enumerate(state.get_op_order())}
    for op_hash, op_data in sorted(state.ops[host].items(), key=lambda item: order.get(item[0], 0)):
        meta = state.op_meta[op_hash]
        names = sorted(meta.names)
        out.append({"names": names, "verdict": judge(_conditions(op_data.global_arguments), op_data.command_generator)})
    return out
