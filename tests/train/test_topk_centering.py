"""Top-k centring in the trainer (issue 12 "Estimators that the setting needs"; Sec 5.2, Sec 7):
``centering_topk`` config checks, the closed-form error metrics of ``train.learner`` (first and
support-aware tail models), and two tiny token-env runs (top-6 sampler, logged k = 2: exact with
the support-aware tail; temperature sampler, k=2: a real tail-model error)."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.envs import samplers
from vccc_jax.estimators import actor
from vccc_jax.train import learner, losses
from vccc_jax.train.config import TrainConfig
from vccc_jax.train.trainer import Trainer

TOKEN = "token:V=16,H=4,Q=3,C=4,P=2,seed=0"
TINY = dict(env=TOKEN, num_envs=2, num_steps=8, total_timesteps=32, num_minibatches=2,
            update_epochs=2, hidden=8, num_layers=1, actor="centered-truncate", gamma=1.0)


# ----------------------------------------------------------------------------- config


def test_config_validation():
    TrainConfig(**TINY, centering_topk=4)  # fine
    with pytest.raises(ValueError, match="centering_topk must be an int >= 0"):
        TrainConfig(**TINY, centering_topk=-1)
    with pytest.raises(ValueError, match="needs a centred actor"):
        TrainConfig(**(TINY | {"actor": "truncate"}), centering_topk=2)
    assert TrainConfig().centering_topk == 0
    # k must be < the number of actions: checked by the learner (the config has no env)
    stub = SimpleNamespace(cfg=TrainConfig(**TINY, centering_topk=16), num_actions=16)
    with pytest.raises(ValueError, match="centering_topk=16 must be < the number of actions 16"):
        losses.centering_k(stub)
    assert losses.centering_k(SimpleNamespace(cfg=stub.cfg, num_actions=17)) == 16


def test_cli_flag():
    from vccc_jax.commands.train import build_parser

    p = build_parser()
    assert "--centering-topk" in p.format_help()
    assert p.parse_args(["--centering-topk", "5"]).centering_topk == 5


# ------------------------------------------------------------------ closed-form errors


def _rows(seed, spec, n=5, v=12):
    rng = np.random.default_rng(seed)
    logits = jnp.asarray(rng.normal(size=(n, v)))
    log_mu = samplers.sampler_log_probs(logits + 0.3 * jnp.asarray(rng.normal(size=(n, v))), spec)
    return logits, log_mu


@jax.jit
def _autodiff_m_w(logits, log_mu, topk_log_mu, topk_ids, old, ns=None):
    """m_w rows by autodiff of the two centering terms wrt the logits (the reference);
    ``ns``: the support-aware tail with support sizes ns."""
    def grad(f):
        return jax.grad(lambda z: jnp.sum(f(jax.nn.log_softmax(z))))(logits)

    exact = grad(lambda lp: actor.centering_term(lp, log_mu, kind="truncate", clip=1.5,
                                                 log_pi_old_all=old))
    approx = grad(lambda lp: actor.centering_term_topk(lp, topk_log_mu, topk_ids, kind="truncate",
                                                       clip=1.5, log_pi_old_all=old, support_size=ns))
    return approx, exact


_sums = jax.jit(learner.topk_centering_error_sums, static_argnums=(2,),
                static_argnames=("kind", "clip", "max_support"))


def test_closed_form_errors_match_autodiff_and_exact_on_support():
    """m_w = C - (sum C) pi (closed form, O(V)) equals the autodiff gradient of the centering
    terms, with and without pi_old, and Z_k / Z equal ``envs.samplers``' expected weights;
    the error vanishes when k covers a top-k sampler's support (k = 4, and k = 6 > the
    support) and is a real tail-model error under temperature sampling with k = 2."""
    with jax.enable_x64(True):
        logits, log_mu = _rows(0, samplers.SamplerSpec(temperature=0.7))
        lpi = jax.nn.log_softmax(logits)
        old = jax.nn.log_softmax(logits + 0.4 * jnp.asarray(np.random.default_rng(1).normal(size=logits.shape)))
        w = jnp.asarray([1.0, 1.0, 0.0, 1.0, 0.5])
        wn = np.asarray(w)
        lp, ids = jax.lax.top_k(log_mu, 2)
        for lpo in (None, old):
            approx, exact = (np.asarray(x) for x in _autodiff_m_w(logits, log_mu, lp, ids, lpo))
            sums = _sums(lpi, log_mu, 2, kind="truncate", clip=1.5, weights=w, log_pi_old_all=lpo)
            np.testing.assert_allclose(sums["mw_err_sq"], np.sum(wn * np.sum((approx - exact) ** 2, -1)), rtol=1e-10)
            np.testing.assert_allclose(sums["mw_sq"], np.sum(wn * np.sum(exact ** 2, -1)), rtol=1e-10)
            errs = learner.finish_topk_errors(sums)
            assert float(errs["mw_topk_rel_err"]) > 0.05  # the tail model is wrong here
            assert float(errs["z_topk_abs_err"]) > 1e-4
            if lpo is None:
                z_k, z = samplers.z_topk(lpi, log_mu, 2, kind="truncate", clip=1.5)
                np.testing.assert_allclose(errs["z_topk_abs_err"],
                                           np.sum(wn * np.abs(z_k - z)) / wn.sum(), rtol=1e-10)
        # top-4 sampler rows, k = 4 (= the support) and k = 6 (> the support): exact
        logits, log_mu = _rows(2, samplers.SamplerSpec(top_k=4))
        lpi = jax.nn.log_softmax(logits)
        for k in (4, 6):
            errs = learner.finish_topk_errors(
                _sums(lpi, log_mu, k, kind="truncate", clip=1.5, weights=w, log_pi_old_all=old))
            assert float(errs["mw_topk_rel_err"]) < 1e-12 and float(errs["z_topk_abs_err"]) < 1e-12
            assert float(errs["mw_norm"]) > 1e-2
    with pytest.raises(ValueError, match="k must be in"):
        learner.topk_centering_error_sums(lpi, log_mu, 13, kind="truncate", clip=1.5)


def test_support_aware_closed_form_errors():
    """With support sizes n_s: the closed form equals autodiff of the support-aware centering
    term (pi_old None / given), Z_k equals ``samplers.z_topk(support_size=)``; on rows of a
    temperature-1 top-6 sampler of pi_old with k = 2 < n_s it is exact (first model: m_w rel
    err 0.6, |Z err| 0.1). On mismatched rows (sampler logits = pi's + 0.3 N(0, 1), temperature
    0.7) its Z error is never larger (truncation: true <= support-aware <= first model, row by
    row; 0.010 vs 0.13 ranked by pi, 0.064 vs 0.15 ranked by a pi_old = pi + 0.4 N(0, 1)), but
    m_w has no such guarantee: rel err 0.48 vs 0.81 ranked by pi, 0.70 vs 0.67 ranked by that
    pi_old (the ranking misses part of mu's support)."""
    with jax.enable_x64(True):
        logits, log_mu = _rows(3, samplers.SamplerSpec(top_k=6, temperature=0.7), n=8, v=16)
        lpi = jax.nn.log_softmax(logits)
        old = jax.nn.log_softmax(logits + 0.4 * jnp.asarray(np.random.default_rng(4).normal(size=logits.shape)))
        ns = actor.behaviour_support_size(log_mu)
        assert np.all(np.asarray(ns) == 6)
        lp, ids = jax.lax.top_k(log_mu, 2)
        for lpo in (None, old):
            approx, exact = (np.asarray(x) for x in _autodiff_m_w(logits, log_mu, lp, ids, lpo, ns))
            new = _sums(lpi, log_mu, 2, kind="truncate", clip=1.5, log_pi_old_all=lpo, support_size=ns)
            np.testing.assert_allclose(new["mw_err_sq"], np.sum((approx - exact) ** 2), rtol=1e-10)
            first = _sums(lpi, log_mu, 2, kind="truncate", clip=1.5, log_pi_old_all=lpo)
            e_new, e_first = learner.finish_topk_errors(new), learner.finish_topk_errors(first)
            assert float(e_new["z_topk_abs_err"]) < 0.5 * float(e_first["z_topk_abs_err"])
            if lpo is None:
                assert float(e_new["mw_topk_rel_err"]) < 0.7 * float(e_first["mw_topk_rel_err"])
                z_k, z = samplers.z_topk(lpi, log_mu, 2, kind="truncate", clip=1.5, support_size=ns)
                np.testing.assert_allclose(e_new["z_topk_abs_err"], np.mean(np.abs(z_k - z)), rtol=1e-10)
                z_first, _ = samplers.z_topk(lpi, log_mu, 2, kind="truncate", clip=1.5)
                assert np.all(np.abs(z_k - z) <= np.abs(z_first - z) + 1e-12)
        # a temperature-1 top-6 sampler of pi_old: the support-aware tail is exact at k = 2
        log_mu = jax.nn.log_softmax(jnp.where(old >= jax.lax.top_k(old, 6)[0][..., -1:], old, -jnp.inf))
        for ms, aware in ((None, True), (6, True), (None, False)):
            e = learner.finish_topk_errors(_sums(lpi, log_mu, 2, kind="truncate", clip=1.5,
                                                 log_pi_old_all=old, max_support=ms,
                                                 support_size=ns if aware else None))
            if aware:
                assert float(e["mw_topk_rel_err"]) < 1e-12 and float(e["z_topk_abs_err"]) < 1e-12
            else:
                assert float(e["mw_topk_rel_err"]) > 0.3 and float(e["z_topk_abs_err"]) > 0.05, e
            assert float(e["mw_norm"]) > 1e-2


def test_support_model_from_the_sampler():
    """(support-aware?, max_support) per config: non-truncating samplers keep the first model
    (n_s = V), top-K uses a lax.top_k bound K, top-p / mismatch the radix select."""
    def model(**extra):
        stub = SimpleNamespace(cfg=TrainConfig(**TINY, centering_topk=2, **extra), num_actions=16)
        return losses.support_model(stub)

    assert model() == (False, None)
    assert model(sampler="temp=0.7,mismatch=int8") == (False, None)
    assert model(sampler="k=16") == (False, None)  # k >= V: no truncation
    assert model(top_k=5) == (True, 5)
    assert model(sampler="temp=0.7,k=6") == (True, 6)
    assert model(sampler="k=6,mismatch=bf16") == (True, None)  # ties at the K-th logit
    assert model(sampler="p=0.9") == (True, None)
    assert model(sampler="k=6,p=0.9") == (True, 6)
    assert model(sampler="greedy=1") == (True, 1)
    assert model(sampler="k=6", correct=False) == (False, None)  # rows are pi_old


def test_loss_stats_only_report_topk_metrics_when_on():
    aux = tuple(jnp.ones((2, 2)) for _ in range(6))
    assert "mw_topk_rel_err" not in learner.loss_stats(aux, False, {})
    sums = {"mw_err_sq": jnp.asarray([[1.0, 3.0]]), "mw_sq": jnp.asarray([[4.0, 12.0]]),
            "z_abs_err": jnp.asarray([[1.0, 2.0]]), "count": jnp.asarray([[4.0, 2.0]])}
    out = learner.loss_stats(aux, False, sums)
    np.testing.assert_allclose(out["mw_topk_rel_err"], 0.5)  # sqrt(4 / 16): over ALL rows
    np.testing.assert_allclose(out["z_topk_abs_err"], 0.5)
    np.testing.assert_allclose(out["mw_norm"], np.sqrt(16 / 6))


# ------------------------------------------------------------------- in the trainer


@pytest.fixture(scope="module")
def runs():
    """(top-6 sampler, centering_topk=2 < 6, default protocol) and (temperature 0.7,
    centering_topk=2, critic_first protocol): two compiles, 2 updates each. The temperature
    run truncates at c = 1: near the near-uniform initial policy every pi / mu < 2, so with
    the default c = 2 nothing is clipped and m_w (and its error) would be 0 up to rounding."""
    out = {}
    for name, extra in (("topk", dict(sampler="k=6", centering_topk=2)),
                        ("temp", dict(sampler="temp=0.7", centering_topk=2, critic_first=True,
                                     actor_clip=1.0))):
        tr = Trainer(TrainConfig(**TINY, **extra))
        final, metrics = tr.train(tr.init())
        out[name] = (tr, final, jax.device_get(metrics))
    return out


def test_trainer_topk_centering_exact_on_sampler_support(runs):
    """Top-6 sampler, logged k = 2: the support-aware tail (n_s = 6 from the logged rows, the
    4 tokens pi_old ranks next, mu ∝ pi_old there) is exact up to float32 rounding (the
    first tail model, over all 14 other tokens, would be far off)."""
    _, _, m = runs["topk"]
    assert m["mw_topk_rel_err"].shape == (2, 1)
    assert np.all(m["mw_topk_rel_err"] < 1e-4), m["mw_topk_rel_err"]  # float32 rounding only
    assert np.all(m["z_topk_abs_err"] < 1e-5), m["z_topk_abs_err"]
    assert np.all(m["mw_norm"] > 1e-2), m["mw_norm"]  # a real m_w (pi mass off the support)


def test_trainer_topk_centering_tail_error_under_temperature(runs):
    _, _, m = runs["temp"]
    assert np.all(np.isfinite(m["actor_loss"]))
    assert np.all(m["mw_norm"] > 1e-5), m["mw_norm"]
    assert np.all(m["mw_topk_rel_err"] > 0.05), m["mw_topk_rel_err"]  # the tail model's error
    assert np.all(m["z_topk_abs_err"] > 0), m["z_topk_abs_err"]


def test_trainer_loss_topk_equals_full_rows_on_support(runs):
    """The actor loss's gradient with centering_topk = 2 equals the full-row centring's
    (centering_topk=0) on rows of a top-4 sampler of pi_old, with the support-aware tail of
    a top-6 (lax.top_k) and of a top-p (radix select) trainer config."""
    tr, final, _ = runs["topk"]
    full = Trainer(tr.config.replace(centering_topk=0))
    top_p = Trainer(tr.config.replace(sampler="p=0.9"))
    n, v = 6, tr.setup.num_actions
    key = jax.random.PRNGKey(3)
    obs = jax.random.normal(key, (n,) + tr.setup.obs_shape)
    logits = jax.random.normal(jax.random.PRNGKey(4), (n, v))
    log_pi = jax.nn.log_softmax(logits)
    log_mu_all = samplers.sampler_log_probs(logits, samplers.SamplerSpec(top_k=4))
    act = jnp.argmax(log_mu_all, -1)
    take = lambda x: jnp.take_along_axis(x, act[:, None], -1)[:, 0]  # noqa: E731
    mb = learner.Batch(obs=obs, action=act, log_mu=take(log_mu_all), log_pi_old=take(log_pi),
                       log_mu_all=log_mu_all, log_pi_old_all=log_pi,
                       advantages=jnp.linspace(-1, 1, n), targets=jnp.zeros(n))
    params = jax.tree_util.tree_map(lambda x: x[0], final.actor_params)
    grads = jax.jit(lambda p: [jax.grad(lambda q, t=t: losses.actor_loss(t.setup, t.values, q, mb)[0])(p)
                               for t in (tr, top_p, full)])(params)
    flat = [np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(g)]) for g in grads]
    np.testing.assert_allclose(flat[0], flat[2], atol=1e-6)
    np.testing.assert_allclose(flat[1], flat[2], atol=1e-6)
    assert np.abs(flat[2]).max() > 1e-4
