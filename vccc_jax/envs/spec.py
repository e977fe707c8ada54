"""Env names and specs, parsed in pure Python (no JAX): ``vccc train`` checks ``--env``
before it imports JAX, and ``envs.make`` / ``envs.token_env`` build from the same parse.

* ``tabular:family=garnet,S=8,...`` -> :func:`parse_tabular_spec` (keys: ``TABULAR_KEYS``);
* ``token:V=1024,H=128,...`` -> :func:`parse_token_spec` (keys: ``TOKEN_ALIASES`` and
  ``TOKEN_KEYS``);
* anything else is a gymnax name (checked when the env is built).

:func:`env_gamma` is the discount an env spec fixes (None for gymnax envs): the trainer's
``gamma`` is taken from it (issue 23).
"""

from __future__ import annotations

from typing import Optional

TABULAR_FAMILIES = ("random", "garnet", "chain")
TABULAR_KEYS = {"family": str, "S": int, "A": int, "gamma": float, "seed": int, "obs": str,
                "d": int, "branching": int, "concentration": float, "slip": float, "H": int,
                "reset_prob": float, "max_steps": int}

# token: short names of tabular.token.make_task's arguments ...
TOKEN_ALIASES = {"V": "num_tokens", "H": "horizon", "Q": "num_states", "C": "num_classes",
                 "P": "num_prompts", "m": "tool_length", "tools": "num_tool_states",
                 "accept": "accept_density"}
# ... and every key by its long name: make_task's keyword arguments (tests/envs check them
# against its signature) and the env's own (seed, onehot_time, last_token_features,
# max_steps). The value is the type the text is read as.
TOKEN_TASK_KEYS = {"num_tokens": int, "horizon": int, "num_states": int, "num_classes": int,
                   "num_prompts": int, "tool_length": int, "num_tool_states": int,
                   "eos": bool, "accept_density": float, "format_reward": float,
                   "length_penalty": float, "gamma": float, "tool_discount": float}
TOKEN_ENV_KEYS = {"seed": int, "onehot_time": bool, "last_token_features": int,
                  "max_steps": int}
TOKEN_KEYS = {**TOKEN_TASK_KEYS, **TOKEN_ENV_KEYS}
TOKEN_GAMMA = 1.0  # the token env's discount when the spec does not set one


LQR_KEYS = {"dim": int, "act": int, "gamma": float, "seed": int, "radius": float, "max_steps": int}


#: The ``KIND:...`` spec prefixes; any other name is a gymnax name.
SPEC_KINDS = ("tabular", "token", "lqr", "brax")


#: gymnax envs with a Box action space (the other gymnax envs here are discrete)
CONTINUOUS_GYMNAX = ("Pendulum-v1", "MountainCarContinuous-v0")


def continuous_actions(name: str) -> bool:
    """Does the env ``name`` have continuous actions (``lqr:`` / ``brax:`` specs and
    :data:`CONTINUOUS_GYMNAX`)? Pure Python: the trainer's config checks use it before JAX."""
    return env_kind(name) in ("lqr", "brax") or name in CONTINUOUS_GYMNAX


def env_kind(name: str) -> str:
    """"tabular", "token", "lqr", "brax" (:data:`SPEC_KINDS`) or "gymnax" for an env name."""
    head = name.partition(":")[0]
    return head if head in SPEC_KINDS else "gymnax"


def _items(name: str, prefix: str):
    text = name[len(prefix):] if name.startswith(prefix) else name
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, eq, value = (x.strip() for x in item.partition("="))
        if not eq:
            raise ValueError(f"env {name!r}: item {item!r} must look like name=value")
        yield key, value


def _read(name: str, key: str, value: str, kind: type):
    if kind is bool:
        if value.lower() in ("1", "true", "yes"):
            return True
        if value.lower() in ("0", "false", "no"):
            return False
    else:
        try:
            return kind(value)
        except ValueError:
            pass
    raise ValueError(f"env {name!r}: {key}={value!r} is not {'an' if kind is int else 'a'} "
                     f"{kind.__name__}")


def parse_tabular_spec(name: str) -> dict:
    """``"tabular:family=garnet,S=8"`` -> {"family": "garnet", "S": 8, ...} (typed, defaults
    filled). Raises a one-line ValueError naming the bad item."""
    out: dict = {"family": "garnet", "S": 8, "A": 3, "gamma": 0.9, "seed": 0, "obs": "onehot",
                 "branching": 2, "concentration": 1.0, "slip": 0.1}
    for key, value in _items(name, "tabular:"):
        if key not in TABULAR_KEYS:
            raise ValueError(f"env {name!r}: unknown key {key!r} (known: {', '.join(TABULAR_KEYS)})")
        out[key] = _read(name, key, value, TABULAR_KEYS[key])
    if out["family"] not in TABULAR_FAMILIES:
        raise ValueError(f"env {name!r}: family must be one of {TABULAR_FAMILIES}, got {out['family']!r}")
    if out["S"] < 2 or out["A"] < 2:
        raise ValueError(f"env {name!r}: need S >= 2 and A >= 2, got S={out['S']} A={out['A']}")
    if not 0 <= out["gamma"] < 1:
        raise ValueError(f"env {name!r}: gamma must lie in [0, 1), got {out['gamma']}")
    out.setdefault("reset_prob", 1.0 - out["gamma"])
    return out


def parse_token_spec(name: str) -> dict:
    """``"token:V=64,H=16,gamma=1"`` -> {"num_tokens": 64, "horizon": 16, "gamma": 1.0}:
    long names, typed values, only the keys given. ValueError for an unknown key (listing
    the valid ones) or a value of the wrong type."""
    out: dict = {}
    for key, value in _items(name, "token:"):
        long = TOKEN_ALIASES.get(key, key)
        if long not in TOKEN_KEYS:
            short = ", ".join(f"{k} ({v})" for k, v in TOKEN_ALIASES.items())
            rest = ", ".join(k for k in TOKEN_KEYS if k not in TOKEN_ALIASES.values())
            raise ValueError(f"env {name!r}: unknown key {key!r} (known: {short}, {rest})")
        out[long] = _read(name, key, value, TOKEN_KEYS[long])
    return out


def parse_lqr_spec(name: str) -> dict:
    """``"lqr:dim=2,act=1"`` -> {"dim": 2, "act": 1, "gamma": 0.9, "seed": 0, "radius": 0.8,
    "max_steps": 200} (typed, defaults filled; one-line ValueError naming the bad item)."""
    out: dict = {"dim": 2, "act": 1, "gamma": 0.9, "seed": 0, "radius": 0.8, "max_steps": 200}
    for key, value in _items(name, "lqr:"):
        if key not in LQR_KEYS:
            raise ValueError(f"env {name!r}: unknown key {key!r} (known: {', '.join(LQR_KEYS)})")
        out[key] = _read(name, key, value, LQR_KEYS[key])
    if out["dim"] < 1 or out["act"] < 1 or out["max_steps"] < 1:
        raise ValueError(f"env {name!r}: dim, act and max_steps must be >= 1")
    if not 0.0 <= out["gamma"] < 1.0 or not 0.0 < out["radius"] < 1.0:
        raise ValueError(f"env {name!r}: gamma must lie in [0, 1) and radius in (0, 1)")
    return out


BRAX_KEYS = {"backend": str, "max_steps": int}


def parse_brax_spec(name: str) -> dict:
    """``"brax:ant,backend=generalized,max_steps=1000"`` -> {"name": "ant", "backend": None
    (brax's default), "max_steps": 1000} (one-line ValueError naming the
    bad item). The first item is the Brax env name (``brax.envs.get_environment``)."""
    head, _, rest = name[len("brax:"):].partition(",")
    if not head.strip() or "=" in head:
        raise ValueError(f"env {name!r}: brax:NAME[,key=value...] needs the Brax env name first")
    out: dict = {"name": head.strip(), "backend": None, "max_steps": 1000}
    for key, value in _items(rest, ""):
        if key not in BRAX_KEYS:
            raise ValueError(f"env {name!r}: unknown key {key!r} (known: {', '.join(BRAX_KEYS)})")
        out[key] = _read(name, key, value, BRAX_KEYS[key])
    if out["max_steps"] < 1:
        raise ValueError(f"env {name!r}: max_steps must be >= 1")
    return out


def env_gamma(name: str) -> Optional[float]:
    """The discount the env spec fixes: a ``tabular:`` / ``token:`` spec's ``gamma`` (or its
    default), None for gymnax envs (their discount is the trainer's choice)."""
    kind = env_kind(name)
    if kind == "tabular":
        return float(parse_tabular_spec(name)["gamma"])
    if kind == "token":
        return float(parse_token_spec(name).get("gamma", TOKEN_GAMMA))
    if kind == "lqr":
        return float(parse_lqr_spec(name)["gamma"])
    return None


def check_env_spec(name: str) -> None:
    """ValueError naming the bad item of a ``tabular:`` / ``token:`` spec or a malformed
    name (gymnax names themselves are checked when the env is built)."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"env must be a non-empty name, got {name!r}")
    if env_kind(name) == "brax":
        parse_brax_spec(name)
    env_gamma(name)
