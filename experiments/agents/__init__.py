"""Gradient-based RL agents compiled end to end on popeval's environments (not installed:
`experiments/anakin.py` and `experiments/dqn.py` import them with `experiments/` on `sys.path`).

- `agents.anakin`: DeepMind's Podracer Anakin architecture (a Q(lambda) learner
  `vmap`ped over environments and run on every device), run by `experiments/anakin.py`;
  `agents.td`: the TD(lambda) errors it learns from.
- `agents.dqn`: DQN with the environment, replay buffer, action selection and update in
  one `lax.scan`, seeds `vmap`ped, run by `experiments/dqn.py`.
- `agents.common`: their typed YAML configs and run logging (CSV, PNG, W&B).
- `agents.anakin_seed`, `agents.dqn_seed`: the seeds' own code (Podracer's notebook, with
  `jax.pmap`; the "CartPole with JAX" Python loop), timed as anchors by `--anchor`.
"""
