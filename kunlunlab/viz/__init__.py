"""Plotly figures for the notebooks; every figure is also written into the run folder.

Importing this package sets plotly's renderer to ``plotly_mimetype+notebook``: JupyterLab draws the
interactive mimetype, and each output also carries an HTML representation with plotly.js embedded
(once per notebook), so ``jupyter nbconvert --to html`` of an executed notebook shows every figure
offline, without a CDN.
"""
import plotly.io as pio

pio.renderers.default = "plotly_mimetype+notebook"
from kunlunlab.viz.agent_views import method_bars, render_trajectory, results_table, stie_heatmaps, table_html
from kunlunlab.viz.figures import memory_figure, recall_latency_figure, save_figure
from kunlunlab.viz.training_views import (before_after_figure, data_figure, reward_components_figure, reward_table_html,
                                          schedule_figure, training_curves)

__all__ = ["before_after_figure", "data_figure", "memory_figure", "method_bars", "recall_latency_figure",
           "render_trajectory", "results_table", "reward_components_figure", "reward_table_html", "save_figure",
           "schedule_figure",
           "stie_heatmaps", "table_html", "training_curves"]
