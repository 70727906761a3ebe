"""Plotly figures for the notebooks; every figure is also written into the run folder.

Importing this package sets plotly's renderer to ``plotly_mimetype+notebook``: JupyterLab draws the
interactive mimetype, and each output also carries an HTML representation with plotly.js embedded
(once per notebook), so ``jupyter nbconvert --to html`` of an executed notebook shows every figure
offline, without a CDN.
"""
import plotly.io as pio

pio.renderers.default = "plotly_mimetype+notebook"
from kunlunlab.viz.agent_views import method_bars, render_trajectory, results_table, stie_heatmaps, table_html
from kunlunlab.viz.figures import memory_figure, pareto_figure, recall_latency_figure, save_figure
from kunlunlab.viz.trajectory_browser import TrajectoryBrowser, record_html, trajectories_html, trajectory_browser
from kunlunlab.viz.training_views import (before_after_figure, clip_ratio_figure, before_after_html, config_table_html, data_figure, sft_loss_figure, reward_components_figure, reward_table_html,
                                          schedule_figure, training_curves)

__all__ = ["before_after_figure", "before_after_html", "config_table_html", "data_figure", "sft_loss_figure", "memory_figure", "method_bars", "pareto_figure", "recall_latency_figure",
           "render_trajectory", "results_table", "reward_components_figure", "reward_table_html", "save_figure",
           "schedule_figure",
           "stie_heatmaps", "table_html", "training_curves"]
__all__ += ["TrajectoryBrowser", "record_html", "trajectories_html", "trajectory_browser"]
from kunlunlab.viz.data_views import (cluster_allocation_figure, cluster_weights_figure, epoch_table_html,
                                      example_trajectories, index_rows_html, mask_legend_html, mixed_trajectory_html,
                                      mixing_summary, reward_explanation_html, reward_rankings, schedule_table_html)

__all__ += ["cluster_allocation_figure", "cluster_weights_figure", "epoch_table_html", "example_trajectories",
            "index_rows_html", "mask_legend_html", "mixed_trajectory_html", "mixing_summary", "reward_explanation_html",
            "reward_rankings", "schedule_table_html"]
from kunlunlab.viz.apps import RewardExplorer, STIETuner, reward_explorer, stie_tuner, stie_tuner_app

__all__ += ["RewardExplorer", "STIETuner", "reward_explorer", "stie_tuner", "stie_tuner_app"]
from kunlunlab.viz.process_views import dapo_runs_figure, pair_stats, pair_stats_figure, pair_stats_table, tree_html

__all__ += ["dapo_runs_figure", "pair_stats", "pair_stats_figure", "pair_stats_table", "tree_html"]
