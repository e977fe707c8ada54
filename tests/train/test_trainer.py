"""The lagged actor-critic trainer: lag-0 exactness, truncation, learning, checkpoints.

Compiling a trainer costs seconds, so every configuration is built once (``_trainer``) and
its full run memoised (``_run``); tests share them.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _exact_programs import DEFAULT_EMITTERS, with_default_emitters

from vccc_jax.envs import rollout as rollout_lib
from vccc_jax.estimators import importance
from vccc_jax.train import checkpoint, learner
from vccc_jax.train import setup as setup_lib
from vccc_jax.train import trainer as trainer_lib
from vccc_jax.train.config import TrainConfig, parse_actor
from vccc_jax.train.programs import ProgramCache, program_values
from vccc_jax.train.targets import (
    CRITIC_TARGETS,
    TargetInputs,
    TargetOutput,
    register_critic_target,
)
from vccc_jax.train.trainer import Trainer

UPDATES = 24
# PureJaxRL CartPole shapes (4 envs x 128 steps, 4 x 4 minibatches), UPDATES updates, with
# lag 0 served through a 3-slot ring buffer (the lagged code path) and the VCCC critic
RING0 = TrainConfig(total_timesteps=4 * 128 * UPDATES, lag="fixed:0", num_versions=3,
                    critic="vccc")


@functools.lru_cache(maxsize=None)
def _trainer(cfg: TrainConfig) -> Trainer:
    return Trainer(cfg)


@functools.lru_cache(maxsize=None)
def _run(cfg: TrainConfig):
    tr = _trainer(cfg)
    state, metrics = tr.train(tr.init())
    return jax.device_get(state), jax.device_get(metrics)


def _leaves_equal(a, b) -> bool:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(
        np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True) for x, y in zip(la, lb))


@functools.lru_cache(maxsize=None)
def _run_default_emitters(cfg: TrainConfig):
    tr = with_default_emitters(Trainer(cfg))
    state, metrics = tr.train(tr.init())
    return jax.device_get(state), jax.device_get(metrics)


def _assert_identical_runs(cfg_a, cfg_b):
    """Two different programs, bit for bit: compiled with the default emitters (_exact_programs.py)."""
    (sa, ma), (sb, mb) = _run_default_emitters(cfg_a), _run_default_emitters(cfg_b)
    assert set(ma) == set(mb)
    for k in ma:
        np.testing.assert_array_equal(ma[k], mb[k], err_msg=k)
    assert _leaves_equal(sa.actor_params, sb.actor_params)
    assert _leaves_equal(sa.critic_params, sb.critic_params)


# -- lag 0 is on-policy training, bit for bit -------------------------------------------


def test_lag0_log_ratios_are_exactly_zero():
    _, m = _run(RING0)
    assert np.all(m["log_rho_q"] == 0.0) and np.all(m["kl_pi_mu"] == 0.0)
    assert np.all(m["clip_frac"] == 0.0) and np.all(m["ess"] == 1.0)
    assert np.all(m["lag_mean"] == 0.0) and np.all(m["nonfinite"] == 0)


@pytest.mark.parametrize(
    "lagged_cfg,on_policy_cfg",
    [
        # VCCC at lag 0 == the same learner ignoring behaviour log-probs (correct=False)
        (RING0, RING0.replace(correct=False, actor="ratio")),
        # V-trace(lambda, rhobar, cbar) at lag 0 == V-trace with rho := 1 (i.e. GAE(lambda),
        # checked on targets below); actor mask == ratio when w == 1
        (RING0.replace(critic="vtrace", actor="mask"),
         RING0.replace(critic="vtrace", correct=False, actor="ratio")),
    ],
    ids=["vccc", "vtrace"],
)
def test_lag0_training_equals_on_policy_training(lagged_cfg, on_policy_cfg):
    """Whole training runs (24 updates, all metrics, final parameters) agree bit for bit:
    at lag 0 the logged log mu equals log pi_k exactly, so every weight is exactly 1."""
    _assert_identical_runs(lagged_cfg, on_policy_cfg)


@functools.lru_cache(maxsize=None)
def _prepare(cfg: TrainConfig):
    tr = Trainer(cfg)
    return jax.jit(functools.partial(learner.prepare, tr.setup, tr.values))


@functools.lru_cache(maxsize=None)
def _lag0_trajectory():
    tr = _trainer(RING0)
    state = jax.tree_util.tree_map(lambda x: x[0], _run(RING0)[0])  # trained: pi far from init
    _, traj = jax.jit(functools.partial(rollout_lib.rollout, tr.setup.env, tr.setup.env_params,
                                        tr.setup.actor_logits, num_steps=64),
                      compiler_options=DEFAULT_EMITTERS)(
        state.versions, state.env, jax.random.PRNGKey(5), lags=jnp.zeros((4,), jnp.int32))
    return state, traj


@pytest.mark.parametrize("critic,reference,baseline", [
    ("vccc", "vccc", "value"), ("vccc", "vccc", "zero"),
    ("truncated", "vccc", "value"), ("masked", "vccc", "value"),
    ("centered_baseline", "vccc", "value"), ("centered_baseline", "vccc", "zero"),
    ("naive_baseline", "uncorrected", "value"), ("naive_baseline", "uncorrected", "zero"),
    ("vtrace", "vtrace", "value"),
])
def test_lag0_every_target_equals_its_on_policy_form(critic, reference, baseline):
    """On a real lag-0 rollout each corrected target and advantage equals the on-policy
    learner's (correct=False: rho := 1) to float32 rounding: two XLA programs, and whether
    (rho - 1) * x with rho == 1 folds away bit for bit depends on the optimisation level (the
    suite compiles at level 0, tests/conftest.py), so 2 ulp. Clipped (Eq 10) and Z-centred (§4.2,
    exact Z = 1) reduce to Vbar + delta like VCCC; the naive clipped control to H; V-trace
    to V-trace with rho := 1, i.e. the GAE(lambda) target."""
    state, traj = _lag0_trajectory()
    cfg = RING0.replace(critic=critic, baseline=baseline, advantage="target")
    ref = RING0.replace(critic=reference, baseline=baseline, advantage="target", correct=False)
    a = _prepare(cfg)(traj, state.critic_params)
    b = _prepare(ref)(traj, state.critic_params)
    assert np.all(np.asarray(a.inputs.transitions.log_rhos) == 0.0)
    # (centred, b = 0: Z(s) = sum_a mu(a) w(a) is 1 only to rounding, so (1 - Z)(b - Vbar) is
    # ~1 ulp of Vbar)
    np.testing.assert_allclose(a.targets, b.targets, rtol=2.5e-7, atol=0)
    ulp2 = 2.5e-7 * float(np.max(np.abs(b.targets)))  # advantage = target - value: its ulps
    np.testing.assert_allclose(a.advantages, b.advantages, rtol=0, atol=ulp2)
    np.testing.assert_array_equal(a.log_mu, b.log_mu)
    if critic == "vtrace":  # ... and with rho == 1 the V-trace target is the GAE target
        # (a different XLA program, so equal to float32 rounding rather than bitwise)
        gae = _prepare(ref.replace(critic="gae"))(traj, state.critic_params)
        np.testing.assert_allclose(a.targets, gae.targets, rtol=1e-6, atol=1e-6)


def test_lag0_ring_buffer_rollout_equals_synchronous_rollout_to_rounding():
    """K = 1 acts with an unbatched forward pass, the ring with a per-env batched one: the
    same maths up to float32 rounding (not bitwise), so the same actions are drawn. The ring
    side is ``_lag0_trajectory``'s rollout (64 steps, key 5, every lag 0): one compile less.
    Both rollouts compile with the default emitters (_exact_programs.py): under the suite's
    legacy ones the two forwards differ by up to 1.8e-6 relative on log-probs ~2."""
    state, ring = _lag0_trajectory()
    tr = _trainer(RING0)
    roll = functools.partial(rollout_lib.rollout, tr.setup.env, tr.setup.env_params, tr.setup.actor_logits,
                             num_steps=64)
    _, sync = jax.jit(roll, compiler_options=DEFAULT_EMITTERS)(state.actor_params, state.env,
                                                               jax.random.PRNGKey(5))
    np.testing.assert_array_equal(ring.action, sync.action)
    np.testing.assert_allclose(ring.log_mu, sync.log_mu, atol=1e-6)
    np.testing.assert_allclose(ring.log_pi_all, sync.log_pi_all, atol=1e-6)
    np.testing.assert_array_equal(ring.reward, sync.reward)


def test_short_training_improves_return():
    """CartPole, 24 updates (12k steps), fixed key: the mean return of the last 4 updates
    is at least 2x that of the first 2 (a random policy gets ~22)."""
    _, m = _run(RING0)
    ret = m["return"][:, 0]
    assert ret[-4:].mean() > 2.0 * ret[:2].mean(), ret
    assert ret[-4:].mean() > 50.0, ret


# -- lagged training: diagnostics, ground truth, seeds -----------------------------------

LAGGED = RING0.replace(total_timesteps=4 * 128 * 8, lag="geometric:2", num_versions=4,
                      critic="vccc", actor="centered-mask", temperature=0.9, gt_every=4,
                      gt_states=4, gt_rollouts=4, gt_horizon=60, eval_envs=2, num_seeds=2,
                      polyak=0.5)


@functools.lru_cache(maxsize=None)
def _lagged_in_two_chunks(tmp):
    """LAGGED as two jitted chunks of 4 updates with a checkpoint round trip in between."""
    tr = _trainer(LAGGED)
    state = tr.init()
    parts = []
    for i in range(2):
        state, m = tr.train(state, 4)
        parts.append(jax.device_get(m))
        checkpoint.save(f"{tmp}/ckpt", state, {"update": 4 * (i + 1)})
        state = checkpoint.load(f"{tmp}/ckpt", tr.init())
    assert checkpoint.read_meta(f"{tmp}/ckpt")["update"] == 8
    metrics = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return jax.device_get(state), metrics


def test_lagged_run_diagnostics_and_ground_truth(tmp_path_factory):
    state, m = _lagged_in_two_chunks(str(tmp_path_factory.mktemp("lagged")))
    n_up, n_seeds = 8, 2
    assert m["return"].shape == (n_up, n_seeds)
    assert m["clip_frac_by_lag"].shape == (n_up, n_seeds, 4)
    np.testing.assert_array_equal(m["count_by_lag"].sum(-1), 4 * 128)
    assert np.all(m["lag_mean"][0] == 0.0)  # only one version exists at the first update
    assert np.all(m["lag_mean"][3:] > 0.0)
    assert np.all((m["ess"] > 0) & (m["ess"] <= 1.0 + 1e-6))
    # temperature 0.9: behaviour != target even at lag 0 (at update 0 the fresh policy is near
    # uniform, so its KL is ~1e-8 and may round below 0)
    assert np.all(m["kl_pi_mu"][1:] > 0.0) and np.all(m["kl_pi_mu"][0] > -1e-6)
    for k in ("critic_loss", "actor_loss", "entropy", "kl_pi_mu"):
        assert np.all(np.isfinite(m[k])), k
    # ground truth at updates 3 and 7 only ((idx + 1) % 4 == 0): the update index carries
    # across chunks and the checkpoint
    is_gt = np.isfinite(m["gt_mse"])
    np.testing.assert_array_equal(is_gt[:, 0], [i % 4 == 3 for i in range(n_up)])
    assert np.all(np.isfinite(m["eval_return"][is_gt])) and np.all(m["gt_stderr"][is_gt] > 0)
    # mean squared error >= squared mean error; bias = mean critic value - mean MC value
    assert np.all(m["gt_mse"][is_gt] >= np.square(m["gt_bias"][is_gt]) * (1 - 1e-5))
    np.testing.assert_allclose(m["gt_bias"][is_gt],
                               (m["gt_critic_value"] - m["gt_value"])[is_gt], rtol=1e-4, atol=1e-4)
    # seeds differ; versions advanced by one per update
    assert not np.array_equal(m["return"][:, 0], m["return"][:, 1])
    np.testing.assert_array_equal(np.asarray(state.versions.version), [n_up, n_up])
    np.testing.assert_array_equal(np.asarray(state.update), [n_up, n_up])


# -- truncation bootstraps, termination does not -------------------------------------------


def _toy_traj(trainer: Trainer, key):
    T, B = 3, 2
    k1, k2, k3 = jax.random.split(key, 3)
    obs = jax.random.normal(k1, (T, B, 4))
    final_obs = jnp.concatenate([obs[1:], jax.random.normal(k2, (1, B, 4))], 0)
    # env 0 is cut by the time limit after t = 1, env 1 terminates after t = 1; after the
    # cut/termination the next obs is a fresh reset, unrelated to final_obs[1]
    final_obs = final_obs.at[1].set(jax.random.normal(k3, (B, 4)))
    terminated = jnp.array([[False, False], [False, True], [False, False]])
    truncated = jnp.array([[False, False], [True, False], [False, False]])
    log_all = jax.nn.log_softmax(jnp.zeros((T, B, 2)))
    return rollout_lib.Trajectory(
        obs=obs, action=jnp.zeros((T, B), jnp.int32), reward=jnp.full((T, B), 1.0),
        terminated=terminated, truncated=truncated, final_obs=final_obs,
        log_mu=log_all[..., 0], log_mu_all=log_all, log_pi_all=log_all,
        lag=jnp.zeros((T, B), jnp.int32), version=jnp.zeros((T, B), jnp.int32),
        episode_return=jnp.zeros((T, B)), episode_length=jnp.zeros((T, B), jnp.int32),
        episode_done=terminated | truncated)


@pytest.mark.parametrize("critic", ["uncorrected", "vccc", "gae", "vtrace"])
def test_truncation_bootstraps_and_termination_does_not(critic):
    cfg = RING0.replace(critic=critic)
    tr = Trainer(cfg)
    params = tr.setup.critic_net.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))
    params = jax.tree_util.tree_map(lambda x: 5.0 * x, params)  # make V clearly non-zero
    traj = _toy_traj(tr, jax.random.PRNGKey(1))
    prep = _prepare(cfg)(traj, params)
    v = lambda o: tr.setup.critic_values(params, o)  # noqa: E731
    g, lam = cfg.gamma, cfg.gae_lambda
    x = prep.inputs.transitions
    np.testing.assert_allclose(x.discounts, np.where(traj.terminated, 0.0, g))
    np.testing.assert_allclose(x.next_values[1, 0], v(traj.final_obs[1, 0]), rtol=1e-6)
    y = np.asarray(prep.targets)
    # at the cut: r + gamma V(final obs), nothing from the reset episode after it
    np.testing.assert_allclose(y[1, 0], 1.0 + g * v(traj.final_obs[1, 0]), rtol=1e-5, atol=1e-5)
    # at the terminal step: r, no bootstrap
    np.testing.assert_allclose(y[1, 1], 1.0, rtol=1e-5, atol=1e-5)
    if critic in ("gae", "vtrace"):  # rho == 1 here, so V-trace is GAE(lambda)
        vals = np.asarray(x.values)
        delta0 = 1.0 + g * vals[1, 0] - vals[0, 0]
        np.testing.assert_allclose(y[0, 0], vals[0, 0] + delta0 + g * lam * (y[1, 0] - vals[1, 0]),
                                   rtol=1e-5, atol=1e-5)
    # the reset observation after the cut does not leak into the targets at t <= 1
    traj2 = traj.replace(obs=traj.obs.at[2].add(3.0))
    y2 = np.asarray(_prepare(cfg)(traj2, params).targets)
    np.testing.assert_allclose(y2[:2], y[:2], rtol=1e-6)


# -- registry, Z(s), config ---------------------------------------------------------------


def test_registry_accepts_comparators_with_the_shared_signature():
    def half_td(x: TargetInputs, cfg: TrainConfig, clip) -> TargetOutput:
        t = x.transitions
        y = t.rewards + t.discounts * t.next_values * 0.5
        return TargetOutput(y, y - t.values)

    register_critic_target("test-half-td", half_td, overwrite=True)
    try:
        tr = Trainer(RING0.replace(critic="test-half-td"))
        params = tr.setup.critic_net.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))
        prep = learner.prepare(tr.setup, tr.values, _toy_traj(tr, jax.random.PRNGKey(1)), params)
        x = prep.inputs.transitions
        np.testing.assert_allclose(prep.targets, x.rewards + 0.5 * x.discounts * x.next_values)
        with pytest.raises(ValueError, match="already registered"):
            register_critic_target("test-half-td", half_td)
    finally:
        CRITIC_TARGETS.pop("test-half-td")
    with pytest.raises(ValueError, match="critic must be one of"):
        Trainer(RING0.replace(critic="nope"))


def test_expected_weight_is_exact_in_float64():
    with jax.enable_x64(True):
        mu = np.array([0.1, 0.6, 0.3])
        pi = np.array([0.5, 0.2, 0.3])
        z = importance.expected_weight(jnp.log(pi), jnp.log(mu), kind="truncate", clip=2.0)
        assert float(z) == pytest.approx(np.sum(mu * np.minimum(pi / mu, 2.0)), abs=1e-12)
        z = importance.expected_weight(jnp.log(pi), jnp.log(pi), kind="mask", clip=2.0)
        assert float(z) == 1.0  # exactly, at lag 0
        # top-k behaviour: an action mu cannot emit contributes nothing, not NaN
        z = importance.expected_weight(jnp.log(pi), jnp.log(np.array([0.0, 0.7, 0.3])), kind="truncate",
                            clip=2.0)
        assert float(z) == pytest.approx(0.7 * 2 / 7 + 0.3, abs=1e-12)


@pytest.mark.parametrize("changes,match", [
    (dict(num_minibatches=3), "num_minibatches"),
    (dict(lag="fixed:4", num_versions=3), "num_versions"),
    (dict(actor="sideways"), "actor must be"),
    (dict(clip_kind="mask", clip=0.5), "clip"),
    (dict(actor="mask", actor_clip=0.5), "actor_clip"),
    (dict(actor="icepop", actor_params="alpha=2,beta=1"), "actor_params"),
    (dict(actor="gspo", actor_params="clip=2"), "actor_params"),
    (dict(actor="centered-gspo"), "score centring"),
    (dict(critic_lambda=1.5), "critic_lambda"),
    (dict(gamma=1.5), "gamma"),
    (dict(total_timesteps=10), "total_timesteps"),
])
def test_config_errors_name_the_argument(changes, match):
    with pytest.raises(ValueError, match=match):
        RING0.replace(**changes)


def test_parse_actor():
    assert parse_actor("centered-mask") == ("mask", True)
    assert parse_actor("tis") == ("truncate", False)
    assert parse_actor("GSPO") == ("gspo", False)  # any row of the actor table (issue 21)
    # geometric:8 keeps K with tail mass P(lag >= K) <= 1e-3: (8/9)^K <= 1e-3
    k = TrainConfig(lag="geometric:8").resolved_num_versions
    assert (8 / 9) ** k <= 1e-3 < (8 / 9) ** (k - 1)
    assert TrainConfig(lag="fixed:0").resolved_num_versions == 1  # synchronous


# -- grid cells that differ only in values share one program (issue 22 §4) ----------------

SMALL = TrainConfig(num_envs=4, num_steps=8, num_minibatches=2, update_epochs=1, hidden=8,
                    total_timesteps=4 * 8 * 3, lag="uniform:1", num_versions=3,
                    critic="truncated", actor="centered-mask", eval_envs=0)


def test_cells_differing_only_in_values_share_one_compiled_program():
    """Learning rates, clips and the lag law's parameter are grid values (an argument of
    the program): a second cell with other values reuses the first cell's compiled program
    through a shared ProgramCache (no new compile), yet trains with its own values (equal,
    to float32 rounding, to its own program with the values as constants, and unlike the
    first cell)."""
    other = SMALL.replace(actor_lr=1e-2, critic_lr=3e-3, clip=1.0001, actor_clip=1.5,
                          lag="uniform:2")
    cache = ProgramCache()
    a, b = Trainer(SMALL, cache), Trainer(other, cache)
    assert a.programs is b.programs and len(cache) == 1
    assert Trainer(other).programs is not a.programs  # no cache: a program of its own
    _, ma = a.train(a.init())
    compiled = a.programs.train._cache_size()
    _, mb = b.train(b.init())
    assert a.programs.train._cache_size() == compiled  # the second cell did not recompile
    ref_state = b.init()
    values = program_values(b.values)
    _, ref = jax.jit(lambda s: trainer_lib.train_scan(b.setup, s, jnp.int32(0), 3, values))(
        ref_state)
    mb, ma, ref = jax.device_get((mb, ma, ref))
    for k in ("actor_loss", "critic_loss", "lag_mean", "clip_frac", "target_mean", "return"):
        np.testing.assert_allclose(mb[k], ref[k], rtol=1e-4, atol=1e-5, err_msg=k)
        if k != "return":  # (3 short updates: few finished episodes, equal returns possible)
            assert not np.allclose(mb[k], ma[k]), k
    assert Trainer(SMALL.replace(seed=5), cache).programs is a.programs  # keys: in the state
    assert Trainer(SMALL.replace(num_versions=4), cache).programs is not a.programs  # K static
    assert len(cache) == 2


def test_program_cache_is_lru():
    cache, built = ProgramCache(max_size=2), []
    build = lambda k: lambda: built.append(k) or k  # noqa: E731
    for k in ("a", "b", "a", "c", "b"):  # "c" evicts "b" (least recently used), not "a"
        cache.get(k, build(k))
    assert built == ["a", "b", "c", "b"] and "a" not in cache and len(cache) == 2


def test_actor_table_row_clip_is_the_grid_actor_clip():
    """A table row with a clip (seq_tis) reads actor_clip from the grid values, so cells
    that share a program (actor_clip is a grid value) each weight with their own clip."""
    cache = ProgramCache()
    a = Trainer(SMALL.replace(actor="seq_tis", actor_clip=1.5), cache)
    b = Trainer(SMALL.replace(actor="seq_tis", actor_clip=3.0), cache)
    assert a.programs is b.programs
    assert setup_lib.actor_row_params(a.setup, a.values)["clip"] == 1.5
    # what the shared program sees when it runs cell b
    assert float(setup_lib.actor_row_params(a.setup, program_values(b.values))["clip"]) == 3.0


# -- checkpoints (chunked runs with checkpoint round trips: tests/train/test_chunked_runs.py) --


def test_checkpoint_rejects_a_different_structure(tmp_path):
    state, _ = _run(RING0)
    checkpoint.save(tmp_path / "c", state)
    with pytest.raises(ValueError, match="leaves|leaf"):
        checkpoint.load(tmp_path / "c", _trainer(LAGGED).init())
