"""Gradient-based RL agents compiled end to end on popeval's environments.

- `popeval.agents.anakin`: DeepMind's Podracer Anakin architecture (a Q(lambda) learner
  `vmap`ped over environments and `pmap`ped over devices), run by `experiments/anakin.py`;
  `popeval.agents.td`: the TD(lambda) errors it learns from.
- `popeval.agents.dqn`: DQN with the environment, replay buffer, action selection and update in
  one `lax.scan`, seeds `vmap`ped, run by `experiments/dqn.py`.
- `popeval.agents.common`: their typed YAML configs and run logging (CSV, PNG, W&B).
- `popeval.agents.anakin_seed`, `popeval.agents.dqn_seed`: the seeds' own code (Podracer's
  notebook; the "CartPole with JAX" Python loop), timed as anchors by `--anchor`.
"""
