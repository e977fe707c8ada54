"""JAX's persistent compilation cache for ``vccc`` commands (issue 22 section 4): where it
goes, how it is turned off, and that a compiled program lands in it and is loaded back."""

import types

import jax
import jax.numpy as jnp
import pytest

from vccc_jax import cli
from vccc_jax.train import compile_cache as cc


def test_resolve_precedence(tmp_path):
    home = {"XDG_CACHE_HOME": str(tmp_path)}
    assert cc.resolve(environ=home) == tmp_path / "vccc_jax" / "jax_cache"
    assert cc.resolve(environ={}) == cc.default_dir({})
    assert str(cc.default_dir({})).endswith(".cache/vccc_jax/jax_cache")
    assert cc.resolve(True, environ=home) is None  # --no-compile-cache
    assert cc.resolve(environ=dict(home, VCCC_COMPILE_CACHE="off")) is None
    assert cc.resolve(environ=dict(home, VCCC_COMPILE_CACHE="/x/y")) == tmp_path.__class__("/x/y")
    mine = dict(home, JAX_COMPILATION_CACHE_DIR="/mine")  # a user's own JAX setting is kept
    assert str(cc.resolve(environ=mine)) == "/mine"
    env = dict(home)
    argv, path = cc.configure(["--config", "x", cc.FLAG], env)
    assert argv == ["--config", "x"] and path is None
    assert env["JAX_ENABLE_COMPILATION_CACHE"] == "false" and "JAX_COMPILATION_CACHE_DIR" not in env
    argv, path = cc.configure(["--config", "x"], env)
    assert path == tmp_path / "vccc_jax" / "jax_cache"
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(path)  # inherited by shard subprocesses


def test_cli_strips_the_flag(capsys, monkeypatch):
    monkeypatch.setattr(cli, "COMMANDS", dict(cli.COMMANDS))
    assert cli.main(["bench", "--no-compile-cache", "nothing"]) == 2
    assert "got 'nothing'" in capsys.readouterr().err  # the flag never reached the command
    assert "--no-compile-cache" in cli.usage()


def test_compiled_program_is_written_then_loaded(tmp_path):
    def f(x):
        return jnp.sin(x) * 3.0 + jnp.cumsum(x)

    x = jnp.arange(7.0)
    before = jax.config.jax_compilation_cache_dir
    hits = []

    def listen(event, **_):
        if event == "/jax/compilation_cache/cache_hits":
            hits.append(event)

    jax.monitoring.register_event_listener(listen)
    try:
        with cc.using(tmp_path):
            jax.jit(f).lower(x).compile()
            assert hits == [] and any(p.is_file() for p in tmp_path.rglob("*")), "not written"
            # the same code as a new function object: jit's in-memory caches (keyed by the
            # function) miss, as in a new process (jax.clear_caches() would also empty the
            # caches of every test that runs after this one in the same pytest worker)
            g = types.FunctionType(f.__code__, f.__globals__, f.__name__)
            got = jax.jit(g)(x)
            assert len(hits) == 1  # loaded from disk, not compiled again
    finally:
        jax.monitoring.unregister_event_listener(listen)
    assert jax.config.jax_compilation_cache_dir == before
    assert jnp.allclose(got, f(x))


@pytest.mark.parametrize("value", ["off", "OFF", "0"])
def test_off_spellings(value):
    assert cc.resolve(environ={"VCCC_COMPILE_CACHE": value}) is None
