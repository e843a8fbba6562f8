"""roles/kernel_cache: JIT caches per engine in the image and compile key on every node, warmed before
production, identical on every rank (the field report's worker with 0 cached TileLang kernels to the
head's 7 compiled past the 60 s broadcast timeout). The serving units mount <kernel_cache_dir>/current;
see checks.py."""
from io import StringIO

from pyinfra import host, state
from pyinfra.operations import python

from roles.kernel_cache.checks import converge_caches, prewarm_env_file, prewarm_env_path
from sparkfleet.decided import decisions
from sparkfleet.plan_types import AFTER_BUILD_STEP
from sparkfleet.model.engine import mounted_files
from sparkfleet.model.serving import node_profile
from sparkfleet import unchanged
from sparkfleet.inventory import cluster_from_state
from sparkfleet.roce_gid import resolve_gid_index

cluster = cluster_from_state(state)
node = cluster.node(host.name)
profile = node_profile(node)
planned = decisions(state)  # the run's plan (tools/plan.py)
plan = planned.caches  # prepare-time: prewarm, repair or nothing, decided once (or after the build)

# 1. The prewarm environment of this rank: production's, plus only what enters no cache key
#    (PREWARM_ENV_ADDITIONS in sparkfleet/model/kernel_cache.py).
unchanged.put(
    name="Write the prewarm environment (production's + PREWARM_ENV_ADDITIONS)",
    src=StringIO(prewarm_env_file(profile, cluster, node, resolve_gid_index(host, node))),  # the GID fact is cached
    dest=prewarm_env_path(node),
    user="root",
    group="root",
    mode="0600",
)

# 1b. The other files of serving_dir the prewarm's containers mount, as production's do (SGLang's
#     logging config): the prewarm runs before roles/serving writes them, and a bind mount of a
#     missing path would make docker create a directory there.
for path, (text, mode) in mounted_files(profile, node).items():
    unchanged.put(
        name=f"Write {path} (mounted by the prewarm and the serving containers)",
        src=StringIO(text),
        dest=path,
        user="root",
        group="root",
        mode=mode,
    )

# 2. Link, prewarm, merge, compare, expire: one step driven from the head across the pair.
#    A plan that leaves it until after the build (the image is built in this run, and the head holds
#    generations an engine warmed for these settings) decides it in the step, by the same rule.
python.call(
    name=("Prewarm and merge the kernel caches" if plan.prewarm else AFTER_BUILD_STEP if plan.after_build
          else "Bring the kernel caches in line with the head's"),
    function=converge_caches,
    prewarm=plan.prewarm,
    after_build=plan.after_build,
    planned=plan.generation,  # None when the image is built in this run
    expire=plan.expire,
    watchdogs=planned.watchdog.pause,  # paused by step 7c; started again if a failed prewarm restores production
    previous_pins=planned.image.worker_pins,  # what production ran, to return to if the prewarm fails
    _if=lambda: node.is_head and plan.converge,
)
