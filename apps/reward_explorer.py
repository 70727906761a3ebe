# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Reward explorer
#
# The dual-mode reward of KunLunBaizeRAG (paper eqs. 17–18, `kunlunlab/training/rewards.py`), as notebook
# 03 explains it. Pick a hand-written case or write your own trajectory (the text after the assistant's
# opening `<think>`), set the gold answer (aliases separated by `|`), the model's own token count (0: not
# counted, no overlong penalty) and the weights; the table shows every component as the trainer sees it,
# and the line under it what the parser read.

# %%
from kunlunlab.viz.apps import reward_explorer

reward_explorer()
