# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # STIE tuner
#
# STIE (paper §2.2, eqs. 5–13, `kunlunlab/agent/stie.py`) decides after each answer round which answer
# is the current one and whether to stop; notebook 05 explains every knob. Move a slider: STIE replays
# every cached round (no generation) and the read-out says what it did: EM, rounds used, why replays
# stopped, redundant / replaced / blocked rounds.
#
# The rows: **simulation** is notebook 05's *labelled simulation* of an answerer that falls into loops
# (200 questions, no model needed). **model** appears when the server was started with
# `KUNLUNLAB_ROUNDS` naming a run's cached rounds (`rounds.jsonl`, written by notebook 05; give the file,
# its `05_stie_tuning` folder or the run folder), e.g.
# `KUNLUNLAB_ROUNDS=experiments/runs/<run> make app` (a relative path is read from the repository root);
# its round budget is capped at the rounds collected.

# %%
from kunlunlab.viz.apps import stie_tuner_app

stie_tuner_app()
