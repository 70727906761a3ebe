"""Notebook 04 shows its config as a compact table of what differs from the defaults, not 100 lines of JSON."""
from kunlunlab.training.config import TrainConfig, load_config
from kunlunlab.viz import config_table_html


def test_the_table_lists_exactly_the_settings_that_differ_from_the_defaults():
    cfg = load_config(None, {"dapo.steps": 3, "lora.enabled": True, "top_k": 1})
    defaults = TrainConfig().to_dict()
    html = config_table_html(cfg.to_dict(), defaults)
    assert html.count("<tr>") == 1 + 2  # header + dapo.steps and lora.enabled (top_k 1 is the default)
    assert "<code>dapo.steps</code></td><td>3</td><td>8</td>" in html
    assert "<code>lora.enabled</code></td><td>True</td><td>False</td>" in html
    n_leaves = html.split("<p>")[1].split()[0]
    assert int(n_leaves) > 100  # everything else is counted, not printed
