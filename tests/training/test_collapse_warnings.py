"""Early warnings of a collapse (slime_search_r1/training/collapse.py): each signal computed from what a rollout
holds, the bands and their warning lines, and the README's constructed run, in which the warning comes before the
reward falls."""

from pathlib import Path


from support.collapse_run import constructed_run, table, warned_signals

REPO = Path(__file__).resolve().parents[2]


async def test_the_readme_s_constructed_run_warns_before_the_reward_falls(make_args, tokenizer, engine, search_config):
    args = make_args(
        n_samples_per_prompt=4,
        rollout_batch_size=2,
        use_wandb=True,
        custom_rollout_log_function_path="generate_with_search.log_rollout_metrics",
    )
    rollouts = await constructed_run(args, tokenizer, engine)
    printed = table(rollouts)
    print(printed)  # pytest -s shows what the README pastes
    healthy = [r.metrics["reward"] for r in rollouts[:4]]
    fallen = [r.rollout_id for r in rollouts if r.metrics["reward"] < min(healthy) - 0.05]
    warned = [r.rollout_id for r in rollouts if r.warnings]
    assert fallen and warned
    assert warned[0] < fallen[0]
    assert not any(r.warnings for r in rollouts[:4])  # the healthy rollouts raise none
    assert "health/repetition_share" in warned_signals(rollouts[warned[0]])
    for readme in ("README.md", "README_zh.md"):
        assert printed in (REPO / readme).read_text(encoding="utf-8"), readme
