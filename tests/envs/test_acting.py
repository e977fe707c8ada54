"""The lagged rollout's actor paths (issue 28 §1): per env, lag-sorted pairs, lag table,
common table.

Every path must act with the version the lags say (checked against a float64 NumPy forward of
that version), give the same actions as the lag table for the same key, and keep lag 0
exactly on-policy (log-ratio bit-exactly 0)."""

import functools

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.envs import acting
from vccc_jax.envs import lag as lag_lib
from vccc_jax.envs import rollout as rollout_lib
from vccc_jax.train.networks import Actor

T, K = 12, 4
LAGS = np.array([0, 1, 2, 3, 0, 2], np.int32)  # B = 6 envs, two at lag 0
B = LAGS.shape[0]


def _np_logits(params, obs):
    """The actor in float64 NumPy: tanh MLP, linear head."""
    p = params["params"]
    x = np.asarray(obs, np.float64)
    for i in range(len(p) - 1):
        x = np.tanh(x @ np.asarray(p[f"Dense_{i}"]["kernel"], np.float64)
                    + np.asarray(p[f"Dense_{i}"]["bias"], np.float64))
    last = p[f"Dense_{len(p) - 1}"]
    return x @ np.asarray(last["kernel"], np.float64) + np.asarray(last["bias"], np.float64)


def _np_log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def setup():
    """CartPole, K = 4 clearly different versions (scaled weights), all pushed."""
    env, env_params = gymnax.make("CartPole-v1")
    net = Actor(2, (16,))
    keys = jax.random.split(jax.random.PRNGKey(0), K)
    versions = [jax.tree_util.tree_map(lambda x: 30.0 * x, net.init(k, jnp.zeros((1, 4))))
                for k in keys]
    buf = lag_lib.init_buffer(versions[0], K)
    for p in versions[1:]:
        buf = lag_lib.push(buf, p)
    carry = rollout_lib.reset(env, env_params, jax.random.PRNGKey(1), B)

    @functools.partial(jax.jit, static_argnames=("path", "switch_every"))
    def run(buf, lags, path, switch_every=0):
        actor = acting.acting_actor(buf, lags, switch_every=switch_every, path=path)
        return rollout_lib.rollout(env, env_params, net.apply, actor, carry,
                                   jax.random.PRNGKey(2), num_steps=T, lags=lags,
                                   switch_every=switch_every, switch_stride=1)[1]

    return net, versions, buf, run


def _log_rho(traj):
    log_pi = jnp.take_along_axis(traj.log_pi_all, traj.action[..., None], -1)[..., 0]
    return np.asarray(log_pi - traj.log_mu)


def _check_against_numpy(net, versions, traj, newest):
    """log mu = log_softmax of the recorded version's float64 forward; log pi = newest's."""
    obs = np.asarray(traj.obs)
    for t in range(T):
        for b in range(B):
            ref = _np_log_softmax(_np_logits(versions[int(traj.version[t, b])], obs[t, b]))
            np.testing.assert_allclose(traj.log_mu_all[t, b], ref, atol=2e-5)
            ref_pi = _np_log_softmax(_np_logits(versions[newest], obs[t, b]))
            np.testing.assert_allclose(traj.log_pi_all[t, b], ref_pi, atol=2e-5)


@pytest.mark.parametrize("switch_every", [0, 3])
def test_per_env_path_acts_like_the_table_with_exact_lag_zero(setup, switch_every):
    """Same key: the per-env path records exactly the table's lags and versions (lag_t =
    max(lag_0 - floor(t / m), 0) under switches every m steps), the same actions, log-probs
    equal to float32 rounding and to a float64 forward of the recorded version, and
    log-ratio bit-exactly 0 wherever the lag is 0."""
    net, versions, buf, run = setup
    lags = jnp.asarray(LAGS)
    per_env = run(buf, lags, "per_env", switch_every)
    table = run(buf, lags, "table", switch_every)
    hops = (np.arange(T)[:, None] // switch_every) if switch_every else 0
    want_lag = np.maximum(LAGS[None, :] - hops, 0) * np.ones((T, 1), np.int32)
    np.testing.assert_array_equal(per_env.lag, want_lag)
    np.testing.assert_array_equal(table.lag, want_lag)
    np.testing.assert_array_equal(per_env.version, K - 1 - want_lag)
    np.testing.assert_array_equal(table.version, K - 1 - want_lag)
    np.testing.assert_array_equal(per_env.action, table.action)
    np.testing.assert_allclose(per_env.log_mu_all, table.log_mu_all, atol=1e-5)
    np.testing.assert_allclose(per_env.log_pi_all, table.log_pi_all, atol=1e-5)
    _check_against_numpy(net, versions, per_env, K - 1)
    rho = _log_rho(per_env)
    at0 = want_lag == 0
    assert at0.sum() >= 2 * T and (~at0).sum() >= T  # both cases occur
    assert np.all(rho[at0] == 0.0)  # bit-exact at lag 0
    assert np.all(np.abs(rho[~at0]) > 0)


@pytest.mark.parametrize("rows", [72, 30, 6])  # T x B = 72 rows: 1 forward; 5 steps
def test_newest_log_probs_in_chunks(setup, monkeypatch, rows):
    """pi_k after the rollout, whatever the chunking (``NEWEST_ROWS`` // B steps per
    forward; here all, 5 with a remainder of 2, and 1 step): the newest's float64
    log-softmax at every lag > 0 entry, and at lag 0 the behaviour's own log-probs bit for
    bit; and the forwards really are that many steps each (a scan of T // steps trips, none
    when one forward covers the rollout)."""
    net, versions, _, _ = setup
    monkeypatch.setattr(acting, "NEWEST_ROWS", rows)
    obs = np.asarray(jax.random.normal(jax.random.PRNGKey(5), (T, B, 4)), np.float32)
    lag = np.broadcast_to(LAGS, (T, B))
    own = np.asarray(jax.random.normal(jax.random.PRNGKey(6), (T, B, 2)), np.float32)
    got = np.asarray(acting.newest_log_probs(net.apply, versions[-1], jnp.asarray(obs),
                                             jnp.asarray(lag), jnp.asarray(own)))
    np.testing.assert_array_equal(got[lag == 0], own[lag == 0])
    want = _np_log_softmax(_np_logits(versions[-1], obs))
    np.testing.assert_allclose(got[lag > 0], want[lag > 0], atol=2e-5)
    jaxpr = jax.make_jaxpr(lambda o: acting.newest_log_probs(
        net.apply, versions[-1], o, jnp.asarray(lag), jnp.asarray(own)))(jnp.asarray(obs))
    trips = [e.params["length"] for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]
    steps = max(1, rows // B)
    assert trips == ([] if steps >= T else [T // steps])


def test_per_env_path_caps_lags_by_the_versions_pushed(setup):
    """After 2 pushes (3 versions) lag 3 reads the oldest available version (id 0)."""
    net, versions, _, run = setup
    buf = lag_lib.init_buffer(versions[0], K)
    for p in versions[1:3]:
        buf = lag_lib.push(buf, p)
    traj = run(buf, jnp.asarray(LAGS), "per_env")
    want = np.minimum(LAGS, 2)
    np.testing.assert_array_equal(traj.lag, np.broadcast_to(want, (T, B)))
    np.testing.assert_array_equal(traj.version, np.broadcast_to(2 - want, (T, B)))
    _check_against_numpy(net, versions, traj, 2)
    assert np.all(_log_rho(traj)[:, want == 0] == 0.0)


def test_acting_actor_paths_and_errors(setup):
    _, _, buf, _ = setup
    lags = jnp.asarray(LAGS)
    per_env = acting.acting_actor(buf, lags, path="per_env")
    assert isinstance(per_env, acting.EnvVersions)
    np.testing.assert_array_equal(per_env.lag, LAGS)
    common = acting.acting_actor(buf, jnp.full((B,), 2), common_lag=2, path="common")
    assert isinstance(common, acting.VersionTable) and common.num_rows == 2
    np.testing.assert_array_equal(common.version, [K - 1, K - 3])
    table = acting.acting_actor(buf, lags, path="table", num_lags=3)
    assert table.num_rows == 3
    with pytest.raises(ValueError, match="rollout path must be"):
        acting.acting_actor(buf, lags, path="grouped")
    with pytest.raises(ValueError, match="common path needs"):
        acting.acting_actor(buf, lags, path="common")
    with pytest.raises(ValueError, match="common path needs"):
        acting.acting_actor(buf, lags, path="common", common_lag=1, switch_every=2)


P = 4610  # CartPole actor 4-64-64-2


@pytest.mark.parametrize("B,K,params,backend,fixed,switch,one,want", [
    (512, 32, P, "cpu", True, 0, True, "common"),     # fixed:L, no switch: 2 rows
    (512, 32, P, "gpu", True, 0, True, "common"),
    (4, 2, P, "cpu", True, 3, True, "table"),         # fixed:L with switches: lags differ
    (4, 2, P, "cpu", False, 0, True, "table"),        # K < 4
    (4, 4, P, "cpu", False, 0, True, "per_env"),      # 18,440 <= 2^17
    (28, 4, P, "cpu", False, 0, True, "per_env"),     # 129,080 <= 2^17 = 131,072
    (29, 4, P, "cpu", False, 0, True, "table"),       # 133,690 > 2^17: needs K >= 8
    (32, 4, P, "cpu", False, 0, True, "table"),       # chunk 2 but K < 8: never sorted
    (4096, 4, P, "cpu", False, 0, True, "table"),
    (4096, 8, P, "cpu", False, 0, True, "sorted"),
    (64, 8, P, "cpu", False, 0, True, "sorted"),      # chunk 2: B >= 8 K
    (63, 8, P, "cpu", False, 0, True, "per_env"),     # chunk 1
    (512, 8, P, "cpu", False, 0, True, "sorted"),
    (512, 32, P, "cpu", False, 0, True, "sorted"),
    (64, 32, P, "cpu", False, 0, True, "per_env"),    # chunk 1
    (97, 8, P, "cpu", False, 0, True, "per_env"),     # prime B: no divisor in [2, 3]
    (512, 8, P, "cpu", False, 3, True, "table"),      # switches: never sorted, K >= 16
    (512, 8, P, "cpu", False, 0, False, "per_env"),   # on a mesh: never sorted
    (909, 8, P, "cpu", False, 0, False, "per_env"),   # 4,190,490 <= 2^22 = 4,194,304
    (910, 8, P, "cpu", False, 0, False, "table"),     # 4,195,100 > 2^22: needs K >= 16
    (910, 16, P, "cpu", False, 0, False, "per_env"),
    (512, 7, P, "cpu", False, 0, False, "table"),
    (4096, 32, P, "cpu", False, 0, False, "per_env"),
    (64, 8, P, "cpu", False, 2, True, "table"),       # switches: K >= 16 up to 2^22
    (64, 16, P, "cpu", False, 2, True, "per_env"),
    (909, 16, P, "cpu", False, 2, True, "per_env"),
    (910, 16, P, "cpu", False, 2, True, "table"),     # then K >= 32
    (4096, 32, P, "cpu", False, 2, True, "per_env"),
    (4, 32, P, "gpu", False, 0, True, "table"),       # other backends: the table
    (512, 8, P, "gpu", False, 0, True, "table"),
    (4, 32, P, "tpu", False, 2, True, "table"),
])
def test_choose_path_rule(B, K, params, backend, fixed, switch, one, want):
    assert acting.choose_path(B, K, params, backend, fixed, switch, one) == want


@pytest.mark.parametrize("B,K,chunk", [(512, 8, 16), (512, 32, 4), (64, 8, 2), (64, 32, 1),
                                       (100, 8, 2), (4, 8, 1), (96, 4, 6)])
def test_sort_chunk(B, K, chunk):
    """The largest divisor of B that is <= B / (4 K), at least 1."""
    assert acting.sort_chunk(B, K) == chunk


_SORT_LAGS = {  # B = 12, K = 4: lag counts far from their mean
    "random": np.array([3, 0, 2, 2, 1, 0, 3, 3, 1, 0, 2, 1], np.int32),
    "all_zero": np.zeros(12, np.int32),
    "all_old": np.full(12, 3, np.int32),
    "one_each_then_old": np.array([0, 1, 2] + [3] * 9, np.int32),
    "alternating": np.tile(np.array([0, 3], np.int32), 6),
    "descending": np.repeat(np.arange(3, -1, -1, dtype=np.int32), 3),
}


@pytest.mark.parametrize("name", sorted(_SORT_LAGS))
@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 6, 12])
def test_sorted_versions_pick_each_envs_own_version(setup, name, chunk):
    """Whatever the lag counts, the flat row env b picks holds env b itself, in a pair whose
    params are env b's version (within the static bound of B / chunk + K - 1 pairs)."""
    _, _, buf, _ = setup
    lags = _SORT_LAGS[name]
    sv = acting.sorted_versions(buf, jnp.asarray(lags), chunk)
    n_envs = lags.shape[0]
    assert sv.rows.shape == (n_envs // chunk + K - 1, chunk)
    np.testing.assert_array_equal(np.asarray(sv.rows).reshape(-1)[np.asarray(sv.pick)],
                                  np.arange(n_envs))
    want = lag_lib.gather(buf, jnp.asarray(lags))
    got = jax.tree_util.tree_map(lambda x: x[np.asarray(sv.pick) // chunk], sv.params)
    jax.tree_util.tree_map(np.testing.assert_array_equal, got, want)
    np.testing.assert_array_equal(sv.version, K - 1 - lags)
    np.testing.assert_array_equal(sv.lag, lags)


def test_sorted_path_acts_like_the_table_with_exact_lag_zero(setup):
    """The sorted path (chunk 2: pairs span several lags) records the table's lags, versions
    and actions for the same key, log-probs equal to float32 rounding and to a float64
    forward of the recorded version, and log-ratio bit-exactly 0 at lag 0; after 2 pushes it
    caps lags by the versions available, as the other paths do."""
    net, versions, buf, run = setup
    env, env_params = gymnax.make("CartPole-v1")
    carry = rollout_lib.reset(env, env_params, jax.random.PRNGKey(1), B)

    @jax.jit
    def run_sorted(buf, lags):
        actor = acting.sorted_versions(buf, lags, 2)
        return rollout_lib.rollout(env, env_params, net.apply, actor, carry,
                                   jax.random.PRNGKey(2), num_steps=T)[1]

    lags = jnp.asarray(LAGS)
    got, table = run_sorted(buf, lags), run(buf, lags, "table")
    np.testing.assert_array_equal(got.lag, np.broadcast_to(LAGS, (T, B)))
    np.testing.assert_array_equal(got.version, table.version)
    np.testing.assert_array_equal(got.action, table.action)
    np.testing.assert_allclose(got.log_mu_all, table.log_mu_all, atol=1e-5)
    np.testing.assert_allclose(got.log_pi_all, table.log_pi_all, atol=1e-5)
    _check_against_numpy(net, versions, got, K - 1)
    rho = _log_rho(got)
    assert np.all(rho[:, LAGS == 0] == 0.0) and np.all(np.abs(rho[:, LAGS != 0]) > 0)
    short = lag_lib.init_buffer(versions[0], K)
    for p in versions[1:3]:
        short = lag_lib.push(short, p)
    capped = run_sorted(short, lags)
    want = np.minimum(LAGS, 2)
    np.testing.assert_array_equal(capped.version, np.broadcast_to(2 - want, (T, B)))
    _check_against_numpy(net, versions, capped, 2)


def test_sorted_path_errors(setup):
    net, _, buf, _ = setup
    lags = jnp.asarray(LAGS)
    with pytest.raises(ValueError, match="chunk must divide num_envs=6"):
        acting.sorted_versions(buf, lags, 4)
    with pytest.raises(ValueError, match="no mid-rollout switches"):
        acting.acting_actor(buf, lags, path="sorted", switch_every=2)
    env, env_params = gymnax.make("CartPole-v1")
    carry = rollout_lib.reset(env, env_params, jax.random.PRNGKey(1), B)
    with pytest.raises(ValueError, match="no mid-rollout switches"):
        rollout_lib.rollout(env, env_params, net.apply, acting.sorted_versions(buf, lags, 2),
                            carry, jax.random.PRNGKey(2), num_steps=T, switch_every=2)
    assert isinstance(acting.acting_actor(buf, lags, path="sorted"), acting.SortedVersions)


def test_choose_path_rejects_empty_sizes():
    with pytest.raises(ValueError, match="num_envs=0"):
        acting.choose_path(0, 8, P, "cpu", False, 0)


def _marked_params(v):
    """A tiny version whose every entry is its version id ``v``."""
    v = jnp.asarray(v, jnp.float32)
    return {"w": jnp.full((2, 3), v), "b": jnp.full((3,), v)}


def test_recorded_lags_in_the_first_updates_match_a_brute_force_loop():
    """The version tables of the first K + 1 updates (the ring not yet full, then full):
    row j of ``lag_table`` records lag min(j, k) after k pushes (capped at K - 1), the version
    k - that lag, and holds that version's parameters; ``common_table`` likewise for its two
    rows, for every common lag."""
    k_ring = 4
    buf = lag_lib.init_buffer(_marked_params(0), k_ring)
    table, common = jax.jit(acting.lag_table), jax.jit(acting.common_table)
    for pushes in range(k_ring + 2):
        if pushes:
            buf = lag_lib.push(buf, _marked_params(pushes))
        cap = min(pushes, k_ring - 1)  # versions 0..pushes exist; the ring keeps K of them
        want_lag = np.array([min(j, cap) for j in range(k_ring)])
        t = table(buf)
        np.testing.assert_array_equal(t.row_lag, want_lag, err_msg=f"after {pushes} pushes")
        np.testing.assert_array_equal(t.version, pushes - want_lag)
        np.testing.assert_array_equal(t.params["b"][:, 0], pushes - want_lag)
        np.testing.assert_array_equal(t.rows(jnp.arange(k_ring + 2, dtype=jnp.int32)),
                                      np.minimum(np.arange(k_ring + 2), k_ring - 1))
        for lag in range(k_ring + 1):
            c = common(buf, jnp.int32(lag))
            np.testing.assert_array_equal(c.row_lag, [0, min(lag, cap)])
            np.testing.assert_array_equal(c.version, [pushes, pushes - min(lag, cap)])
            np.testing.assert_array_equal(c.params["b"][:, 0], [pushes, pushes - min(lag, cap)])
