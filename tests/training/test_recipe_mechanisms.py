"""What a recipe's own RL mechanism did, read back from a run's rollout log: REX-RAG's probing per step and UR2's
retrieval offered per curriculum stage (issue 52's per-step figures, shown by notebook 08 and table2_report.py)."""
import gzip
import json

from kunlunlab.training.records import recipe_mechanisms


def _log(folder, rows, gz=False):
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        (folder / "dapo_rollouts.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    else:
        (folder / "dapo_rollouts.jsonl").write_text(text)


def test_rex_rag_probing_per_step_with_a_resumed_step_counted_once(tmp_path):
    _log(tmp_path, [
        {"step": 0, "rollouts": 8, "dead_end_groups": 2, "probe_group_share": 1.0, "probes_kept": 1,
         "importance_weight_mean": 0.97},
        {"step": 2, "rollouts": 8, "dead_end_groups": 0, "probe_group_share": 0.0, "probes_kept": 0,
         "importance_weight_mean": 1.0},
        {"step": 2, "rollouts": 8, "dead_end_groups": 1, "probe_group_share": 0.5, "probes_kept": 1,
         "importance_weight_mean": 0.9}])  # step 2 rolled out again after a resume: its last record counts
    seen = recipe_mechanisms(tmp_path)
    assert seen == {"probes": [
        {"step": 0, "dead_end_groups": 2, "probe_group_share": 1.0, "probes_kept": 1, "importance_weight_mean": 0.97},
        {"step": 2, "dead_end_groups": 1, "probe_group_share": 0.5, "probes_kept": 1, "importance_weight_mean": 0.9}]}


def test_ur2_offer_share_per_stage_weighted_by_rollouts_from_a_kept_gzipped_log(tmp_path):
    _log(tmp_path, [
        {"step": 0, "rollouts": 8, "curriculum_stage": 1, "retrieval_offered": 1.0, "difficulty_generated": 8},
        {"step": 2, "rollouts": 8, "curriculum_stage": 2, "retrieval_offered": 0.5, "difficulty_generated": 4},
        {"step": 4, "rollouts": 4, "curriculum_stage": 2, "retrieval_offered": 0.0, "difficulty_generated": 0}],
        gz=True)
    seen = recipe_mechanisms(tmp_path)
    # stage 2: (0.5 * 8 + 0.0 * 4) / 12 trajectories offered retrieval
    assert seen["offered_by_stage"] == {1: 1.0, 2: 4 / 12}
    assert seen["difficulty_generated"] == 12 and "probes" not in seen


def test_a_recipe_without_either_mechanism_reports_nothing(tmp_path):
    _log(tmp_path, [{"step": 0, "rollouts": 8}])
    assert recipe_mechanisms(tmp_path) == {}
