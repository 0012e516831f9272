"""Gradient-based RL agents compiled end to end on popeval's environments.

- `popeval.agents.anakin`: DeepMind's Podracer Anakin architecture (a Q(lambda) learner
  `vmap`ped over environments and `pmap`ped over devices), run by `experiments/anakin.py`.
- `popeval.agents.dqn`: DQN with the environment, replay buffer, action selection and update in
  one `lax.scan`, seeds `vmap`ped, run by `experiments/dqn.py`.
- `popeval.agents.common`: their typed YAML configs and run logging (CSV, PNG, W&B).
"""
