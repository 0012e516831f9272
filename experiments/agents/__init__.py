"""Gradient-based RL agents compiled end to end on popeval's environments (not installed), run
as `python -m experiments.agents anakin|dqn` (`experiments.agents.__main__`).

- `anakin`: DeepMind's Podracer Anakin architecture (a Q(lambda) learner `vmap`ped over
  environments and run on every device); `td`: the TD(lambda) errors it learns from.
- `dqn`: DQN with the environment, replay buffer, action selection and update in one
  `lax.scan`, seeds `vmap`ped.
- `common`: their typed YAML configs and run logging (CSV, PNG, W&B).
- `anakin_seed`, `dqn_seed`: the seeds' own code (Podracer's notebook, with `jax.pmap`; the
  "CartPole with JAX" Python loop), timed as anchors by `--anchor`.
"""
