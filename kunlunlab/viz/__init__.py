"""Plotly figures for the notebooks; every figure is also written into the run folder."""
from kunlunlab.viz.agent_views import method_bars, render_trajectory, results_table, stie_heatmaps, table_html
from kunlunlab.viz.figures import memory_figure, recall_latency_figure, save_figure

__all__ = ["memory_figure", "method_bars", "recall_latency_figure", "render_trajectory", "results_table",
           "save_figure", "stie_heatmaps", "table_html"]
