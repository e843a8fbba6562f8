"""One serving group's cross-node invariants, checked before any connection (sparkfleet/config.py):
one profile for all its nodes, loadable, sized for it, pins the engine reads, and every rank's
command line rendering. Above both the schema and the engine's command line, which it uses."""
from types import SimpleNamespace

from sparkfleet.model.engine import engine_args
from sparkfleet.model.env_readers import unread_engine_vars
from sparkfleet.model.serving import SECRET_VARS, SHARED_SERVING_KEYS, node_profile, parallelism_problems


def serving_problems(nodes) -> list[str]:
    """Cross-node serving invariants of one serving group: one profile for all its nodes, loadable,
    sized for it (TP x PP = its node count)."""
    problems = []
    for key in SHARED_SERVING_KEYS:
        values = {repr(getattr(n, key)) for n in nodes}
        if len(values) > 1:
            found = ", ".join(f"{n.name}={getattr(n, key)!r}" for n in nodes)
            problems.append(f"key '{key}' differs between nodes ({found}); every rank serves the same profile")
    if problems:
        return problems
    node = nodes[0]
    try:
        profile = node_profile(node)
    except ValueError as err:
        return [f"{', '.join(n.name for n in nodes)}: key 'serving_profile' = {node.serving_profile!r}: {err}"]
    problems += parallelism_problems(profile, nodes)
    problems += [f"{n.name}: key 'serving_env_pins': {why}; a pin the engine does not read changes nothing (a "
                 f"variable the recipe's launcher reads belongs in the profile's launcher_env)"
                 for n in nodes for why in unread_engine_vars(profile.engine, n.serving_env_pins, profile.engine_version)]
    problems += [f"{n.name}: key 'serving_env_pins': {name} is a secret (data is no place for one, and every rank's "
                 f"env file would hold it): {SECRET_VARS[name]}" for n in nodes for name in sorted(n.serving_env_pins)
                 if name in SECRET_VARS]
    # Every rank's command line renders (extra args that repeat a rendered flag, a refused setting).
    shape = SimpleNamespace(nodes=nodes, head=next(n for n in nodes if n.is_head))
    for n in nodes:
        try:
            engine_args(profile, shape, n)
        except ValueError as err:
            problems.append(str(err))
    return problems
