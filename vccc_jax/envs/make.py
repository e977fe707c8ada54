"""Testbeds by name (``make_env``) and the gymnax names the trainer is tested on.

Three families of names:

* gymnax: ``CartPole-v1``, ..., ``DeepSea-bsuite:N`` / ``UmbrellaChain-bsuite:N`` (size);
* ``tabular:family=garnet,S=8,A=3,obs=onehot,seed=0,...``: a :class:`~vccc_jax.tabular.mdp.TabularMDP`
  behind the gymnax API (``envs.tabular_env``; exact ground truth via ``envs.exact_truth``).
  Keys: family (random | garnet | chain), S, A, gamma (0.9), seed (0), obs (onehot |
  features | onehot_time), d (feature dim), branching (garnet; 2), concentration (random; 1),
  slip (chain; 0.1), H (finite horizon; random/garnet only), reset_prob (default 1 - gamma),
  max_steps (time limit);
* ``token:V=1024,H=128,...``: the LLM-shaped token env (``envs.token_env.make_token_env``);
* ``lqr:dim=2,act=1,gamma=0.9,seed=0,radius=0.8,max_steps=200``: the continuous-action LQR
  testbed (``envs.lqr_env``; exact truth in ``tabular.lqr``);
* ``brax:NAME,backend=...,max_steps=1000``: a Brax env (``envs.brax_env``; the ``brax`` extra).
"""

from __future__ import annotations

import gymnax
import jax

from vccc_jax.envs.lqr_env import make_lqr_env
from vccc_jax.envs.spec import TABULAR_FAMILIES, env_kind, parse_tabular_spec  # noqa: F401
from vccc_jax.envs.tabular_env import make_tabular_env
from vccc_jax.envs.token_env import make_token_env
from vccc_jax.tabular import mdp as mdp_lib

ENVS = ("CartPole-v1", "Acrobot-v1", "Breakout-MinAtar", "DeepSea-bsuite", "UmbrellaChain-bsuite")


def make_tabular(name: str):
    """(TabularEnv, EnvParams) for a ``tabular:...`` spec (see the module docstring)."""
    c = parse_tabular_spec(name)
    key = jax.random.PRNGKey(c["seed"])
    k_mdp, k_obs = jax.random.split(key)
    try:
        if c["family"] == "garnet":
            mdp = mdp_lib.garnet_mdp(k_mdp, 1, c["S"], c["A"], c["branching"], gamma=c["gamma"])[0]
        elif c["family"] == "random":
            mdp = mdp_lib.random_mdp(k_mdp, 1, c["S"], c["A"], gamma=c["gamma"],
                                     concentration=c["concentration"])[0]
        else:
            mdp = mdp_lib.chain_mdp(c["S"], gamma=c["gamma"], slip=c["slip"], num_actions=c["A"])
        if "H" in c:
            if c["family"] == "chain":
                raise ValueError("H (finite horizon) is for family random / garnet")
            mdp = mdp_lib.with_horizon(mdp, c["H"])
        return make_tabular_env(mdp, c["obs"], feature_dim=c.get("d"), key=k_obs,
                                max_steps_in_episode=c.get("max_steps"),
                                reset_prob=c["reset_prob"])
    except ValueError as err:
        raise ValueError(f"env {name!r}: {err}") from None


def make_env(name: str):
    """(env, params) for a gymnax name, a ``tabular:...`` or a ``token:...`` spec."""
    kind = env_kind(name)
    if kind == "tabular":
        return make_tabular(name)
    if kind == "lqr":
        try:
            return make_lqr_env(name)
        except ValueError as err:
            msg = str(err)
            raise ValueError(msg if msg.startswith("env ") else f"env {name!r}: {msg}") from None
    if kind == "brax":
        from vccc_jax.envs.brax_env import make_brax_env  # optional extra: import on use

        return make_brax_env(name)
    if kind == "token":
        try:
            return make_token_env(name)
        except (ValueError, TypeError) as err:
            msg = str(err)  # envs.spec errors already name the env
            raise ValueError(msg if msg.startswith("env ") else f"env {name!r}: {msg}") from None
    base, _, arg = name.partition(":")
    kwargs = {}
    if arg:
        if base == "DeepSea-bsuite":
            kwargs["size"] = int(arg)
        elif base == "UmbrellaChain-bsuite":
            kwargs["n_distractor"] = int(arg)
        else:
            raise ValueError(f"env {name!r}: only DeepSea-bsuite:SIZE and "
                             "UmbrellaChain-bsuite:DISTRACTORS take a parameter")
    try:
        env, params = gymnax.make(base, **kwargs)
    except ValueError:
        import difflib

        known = list(dict.fromkeys([*ENVS, *gymnax.registered_envs]))
        close = difflib.get_close_matches(base, known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(f"env {name!r} is not a gymnax environment ({hint}`vccc list envs` "
                         "lists them)") from None
    return env, params
