"""TD(lambda) errors of a trajectory (Sutton and Barto, "Reinforcement Learning: An
Introduction", 2nd ed., section 12.1, the lambda-return), with the semantics of
`rlax.td_lambda` that seed 003's Anakin learner uses; `tests/experiments/test_anakin.py` checks it against
the recursion written out in numpy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["td_lambda"]


def td_lambda(v_tm1: jax.Array, r_t: jax.Array, discount_t: jax.Array, v_t: jax.Array,
              lambda_: float | jax.Array, stop_target_gradients: bool = True) -> jax.Array:
    """TD(lambda) errors of a trajectory: `G_t - v_tm1`, all arrays `(T,)`.

    The lambda-return is computed backwards, bootstrapped from `v_t[-1]`:
    `G_t = r_t + discount_t * ((1 - lambda_) * v_t + lambda_ * G_{t+1})`, with `G_T = v_t[-1]`
    (the semantics of `rlax.td_lambda`).

    Args:
        v_tm1: values of the states the steps start from (the predictions).
        r_t, discount_t, v_t: the reward, discount and value of the state each step reaches.
        lambda_: a scalar or `(T,)`; 0 gives one-step TD errors, 1 Monte Carlo returns
            bootstrapped at the end.
        stop_target_gradients: no gradient flows into the returns (targets), as in rlax.

    Returns:
        td_error: jax.Array  # (T,)
    """
    lambda_ = jnp.broadcast_to(jnp.asarray(lambda_, r_t.dtype), r_t.shape)

    def backward(g_next, x):
        r, discount, v, lam = x
        g = r + discount * ((1 - lam) * v + lam * g_next)
        return g, g

    _, returns = jax.lax.scan(backward, v_t[-1], (r_t, discount_t, v_t, lambda_), reverse=True)
    if stop_target_gradients:
        returns = jax.lax.stop_gradient(returns)
    return returns - v_tm1
