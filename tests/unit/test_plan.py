"""The run's plan table (tools/plan.py): a row per serving group, what crosses the fabric per
node, and why each group restarts."""
from tools.plan import GroupPlan, plan_table


def test_a_row_per_group_with_what_is_fetched_built_shipped_warmed_and_restarted():
    moving = GroupPlan(group="g1", profile="glm-5.3-flash-exl3", image="i", nodes=["spark-a", "spark-b"],
                       fetch=["model", "drafter"], build=True,
                       ship=["image -> spark-b", "model -> spark-b", "drafter -> spark-b"], warm="prewarm",
                       restart=True, reasons=["image new", "spark-a: unit changed", "c", "d", "e", "f"])
    still = GroupPlan(group="g2", profile="glm-5.3-flash-exl3", image="i", nodes=["spark-c", "spark-d"], healthy=True)
    down = GroupPlan(group="g3", profile="glm-5.3-flash-exl3", image="i", nodes=["spark-e", "spark-f"],
                     ship=["model -> spark-f"])
    lines = plan_table({"g3": down, "g1": moving, "g2": still})
    assert lines[0].split() == ["group", "profile", "nodes", "(head", "first)", "fetch", "build", "ship", "over", "the",
                                "fabric", "warm", "restart"]
    assert lines[1].split() == ["g1", "glm-5.3-flash-exl3", "spark-a,", "spark-b", "2", "models", "yes", "spark-b:",
                                "image,", "2", "models", "prewarm", "yes"]
    assert lines[2].split() == ["g2", "glm-5.3-flash-exl3", "spark-c,", "spark-d", "-", "-", "-", "-", "no,", "serving"]
    assert lines[3].split() == ["g3", "glm-5.3-flash-exl3", "spark-e,", "spark-f", "-", "-", "spark-f:", "1", "model",
                                "-", "no,", "/health", "not", "200"]
    assert "  g1 fetches: model, drafter" in lines
    assert "  g1 restarts: image new; spark-a: unit changed; c; d (and 2 more)" in lines
    assert not any(line.startswith("  g2") for line in lines)
    assert moving.changes and down.changes and not still.changes
