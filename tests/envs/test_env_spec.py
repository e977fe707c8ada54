"""``envs.spec``: the pure-Python env-spec parser knows exactly the keys the builders take
(so an unknown key is named with the valid ones, before JAX is imported)."""

import inspect

import pytest

from vccc_jax.envs import spec
from vccc_jax.tabular.token import make_task


def test_token_keys_are_make_tasks_arguments():
    params = set(inspect.signature(make_task).parameters) - {"key", "dtype"}
    assert set(spec.TOKEN_TASK_KEYS) == params
    assert set(spec.TOKEN_ALIASES.values()) <= params
    assert inspect.signature(make_task).parameters["gamma"].default == spec.TOKEN_GAMMA


def test_token_spec_parses_aliases_types_and_names_bad_keys():
    assert spec.parse_token_spec("token:V=64,H=16,eos=0,accept=0.5,seed=3") == {
        "num_tokens": 64, "horizon": 16, "eos": False, "accept_density": 0.5, "seed": 3}
    with pytest.raises(ValueError, match=r"unknown key 'X' \(known: V \(num_tokens\).*max_steps"):
        spec.parse_token_spec("token:V=4,X=1")
    with pytest.raises(ValueError, match="eos='maybe' is not a bool"):
        spec.parse_token_spec("token:eos=maybe")
    with pytest.raises(ValueError, match="must look like name=value"):
        spec.parse_token_spec("token:V")
    assert spec.env_gamma("token:V=4") == 1.0 and spec.env_gamma("tabular:S=3") == 0.9
    assert spec.env_gamma("CartPole-v1") is None
