"""Testbeds by name (``make_env``) and the gymnax names the trainer is tested on.

Three families of names:

* gymnax: ``CartPole-v1``, ..., ``DeepSea-bsuite:N`` / ``UmbrellaChain-bsuite:N`` (size);
* ``tabular:family=garnet,S=8,A=3,obs=onehot,seed=0,...``: a :class:`~vccc_jax.tabular.mdp.TabularMDP`
  behind the gymnax API (``envs.tabular_env``; exact ground truth via ``envs.exact_truth``).
  Keys: family (random | garnet | chain), S, A, gamma (0.9), seed (0), obs (onehot |
  features | onehot_time), d (feature dim), branching (garnet; 2), concentration (random; 1),
  slip (chain; 0.1), H (finite horizon; random/garnet only), reset_prob (default 1 - gamma),
  max_steps (time limit);
* ``token:V=1024,H=128,...``: the LLM-shaped token env (``envs.token_env.make_token_env``).
"""

from __future__ import annotations

import gymnax
import jax

from vccc_jax.envs.tabular_env import make_tabular_env
from vccc_jax.envs.token_env import make_token_env
from vccc_jax.tabular import mdp as mdp_lib

ENVS = ("CartPole-v1", "Acrobot-v1", "Breakout-MinAtar", "DeepSea-bsuite", "UmbrellaChain-bsuite")
TABULAR_FAMILIES = ("random", "garnet", "chain")
_TABULAR_KEYS = {"family": str, "S": int, "A": int, "gamma": float, "seed": int, "obs": str,
                 "d": int, "branching": int, "concentration": float, "slip": float, "H": int,
                 "reset_prob": float, "max_steps": int}


def env_kind(name: str) -> str:
    """"tabular", "token" or "gymnax" for an env name."""
    head = name.partition(":")[0]
    return head if head in ("tabular", "token") else "gymnax"


def parse_tabular_spec(name: str) -> dict:
    """``"tabular:family=garnet,S=8"`` -> {"family": "garnet", "S": 8, ...} (typed, defaults
    filled). Raises a one-line ValueError naming the bad item."""
    text = name[len("tabular:"):] if name.startswith("tabular:") else name
    out: dict = {"family": "garnet", "S": 8, "A": 3, "gamma": 0.9, "seed": 0, "obs": "onehot",
                 "branching": 2, "concentration": 1.0, "slip": 0.1}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, eq, value = (x.strip() for x in item.partition("="))
        if not eq:
            raise ValueError(f"env {name!r}: item {item!r} must look like key=value")
        if key not in _TABULAR_KEYS:
            raise ValueError(f"env {name!r}: unknown key {key!r} (known: {', '.join(_TABULAR_KEYS)})")
        try:
            out[key] = _TABULAR_KEYS[key](value)
        except ValueError:
            raise ValueError(f"env {name!r}: {key}={value!r} is not a {_TABULAR_KEYS[key].__name__}") from None
    if out["family"] not in TABULAR_FAMILIES:
        raise ValueError(f"env {name!r}: family must be one of {TABULAR_FAMILIES}, got {out['family']!r}")
    if out["S"] < 2 or out["A"] < 2:
        raise ValueError(f"env {name!r}: need S >= 2 and A >= 2, got S={out['S']} A={out['A']}")
    if not 0 <= out["gamma"] < 1:
        raise ValueError(f"env {name!r}: gamma must lie in [0, 1), got {out['gamma']}")
    out.setdefault("reset_prob", 1.0 - out["gamma"])
    return out


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
    if kind == "token":
        try:
            return make_token_env(name)
        except (ValueError, TypeError) as err:
            raise ValueError(f"env {name!r}: {err}") from None
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
    except ValueError as err:
        raise ValueError(f"env {name!r} is not a gymnax environment ({err})") from None
    return env, params
