"""Plotly figures for the notebooks; every figure is also written into the run folder."""
from kunlunlab.viz.figures import memory_figure, recall_latency_figure, save_figure

__all__ = ["memory_figure", "recall_latency_figure", "save_figure"]
