"""The mutants of ``vccc bench mutants``: realistic one-line bugs, one per entry.

Each entry names the file, the exact snippet it replaces (it must occur exactly once in the
file: the bench refuses the list otherwise, so a code change that moves a line shows up
here), the replacement, and what the bug would do to a user. ``origin`` says where the
mutant comes from: "issue 27" (the bugs that survived every check when the issue was filed)
or "i27" (added with the mutation check). ``tests``: test files run on top of the mutated
module's own (``tests/<layer>/test_*<stem>*.py``), for modules whose tests live elsewhere.
"""

from __future__ import annotations

from typing import NamedTuple


class Mutant(NamedTuple):
    name: str
    file: str
    original: str
    replacement: str
    breaks: str
    origin: str = "i27"
    tests: tuple = ()


_TRAINER = ("tests/train/test_conformance.py", "tests/train/test_trainer_envs.py")
_CONT = ("tests/train/test_continuous.py",)
_HEADS = "vccc_jax/envs/policy_heads.py"
_TSEC = ("tests/verify/test_trainer_section.py",)
_BYO = ("tests/verify/test_byo.py",)

MUTANTS = (
    # ---------------------------------------------------------------- issue 44: Gaussian head
    Mutant("head-tanh-logdet-dropped", _HEADS,
           "return distrax.Transformed(base, distrax.Block(distrax.Chain([affine, distrax.Tanh()]), 1))",
           "return distrax.Transformed(base, distrax.Block(distrax.Chain([affine, distrax.Tanh()]), 1)) "
           "if False else base",
           "the squashed policy scored as the raw Gaussian (no change of variables: the "
           "log-det and the atanh dropped); its density no longer integrates to 1 on the box",
           "issue 44"),
    Mutant("head-std-vs-variance", _HEADS, "z = (action - mean) * jnp.exp(-log_std)",
           "z = (action - mean) * jnp.exp(-2 * log_std)",
           "every Gaussian log-density (log pi, log mu, the log-ratios) with std^2 for std",
           "issue 44", _CONT),
    Mutant("head-noise-scale-not-logged", "vccc_jax/envs/rollout.py",
           "log_mu = head.log_prob(log_mu_all, action)", "log_mu = head.log_prob(log_b_all, action)",
           "the behaviour samples from std x noise_scale (a temperature) but logs the unscaled "
           "density: every log-ratio off", "issue 44", _CONT),
    # ---------------------------------------------------------------- issue 44: held out (item 6)
    Mutant("continuous-truncation-as-termination", "vccc_jax/envs/rollout.py",
           "terminated = jnp.asarray(terminated, bool)\n        truncated = jnp.logical_and(",
           "terminated = jnp.asarray(terminated, bool) | jnp.asarray(truncated, bool)\n        "
           "truncated = jnp.logical_and(",
           "a time-limit cut (Pendulum, lqr:, brax:) logged as a termination: no bootstrap there",
           "issue 44", _CONT),
    Mutant("critic-first-stale-advantages", "vccc_jax/train/learner.py",
           "batch = batch._replace(advantages=prep.advantages)",
           "batch = batch._replace(advantages=batch.advantages)",
           "critic-first's actor uses the start-of-update critic's advantages", "issue 44"),
    Mutant("bstar-h-ignores-termination", "vccc_jax/train/learner.py",
           "t.rewards + t.discounts * t.next_values", "t.rewards + cfg.gamma * t.next_values",
           "b_psi regresses toward b* with H bootstrapping past terminal states", "issue 44"),
    Mutant("vtrace-pg-clip-cbar", "vccc_jax/train/targets.py",
           "clip_pg_rho_threshold=rho_bar,", "clip_pg_rho_threshold=c_bar,",
           "the trainer's V-trace actor advantages clipped at cbar instead of rhobar", "issue 44",
           _TSEC),
    Mutant("verify-trainer-log-rhos-self", "vccc_jax/verify/sections/trainer.py",
           'out["log_rhos"] = (tx.log_rhos, x["log_rhos"])',
           'out["log_rhos"] = (tx.log_rhos, tx.log_rhos)',
           "the trainer's log-ratio row compares them with themselves: any log-ratio bug passes",
           "issue 44", _TSEC),
    Mutant("verify-trainer-actor-at-pi-k", "vccc_jax/verify/sections/trainer.py",
           "theta = _perturb(actor, k_t, 0.3)", "theta = actor",
           "the trainer's actor rows at theta = pi_k, where no PPO clip fires: clip bugs pass",
           "issue 44", _TSEC),
    # ---------------------------------------------------------------- issue 44: our own
    Mutant("head-z-uses-pi-mass", _HEADS, "return le_pi + c * (1.0 - le_mu)",
           "return le_pi + c * (1.0 - le_pi)",
           "Z(s) of a Gaussian pair with the clipped mass measured under pi, not mu", "issue 44",
           _CONT),
    Mutant("head-z-mask-one-sided", _HEADS,
           "return _p_rho_le(m_pi, log_s_pi, m_mu, log_s_mu, jnp.log(c))[0] - _p_rho_le(",
           "return _p_rho_le(m_pi, log_s_pi, m_mu, log_s_mu, jnp.log(c))[0] - 0 * _p_rho_le(",
           "the masked Z ignores the lower threshold rho >= 1/c", "issue 44"),
    Mutant("head-lag0-not-exact", _HEADS, "return jnp.where(same, known, self.log_prob(rows, action))",
           "return self.log_prob(rows, action)",
           "lag-0 Gaussian log-ratios 0 only up to rounding (two compilations of one density)",
           "issue 44", _CONT),
    Mutant("head-kl-sign", _HEADS, "return jnp.sum(lq - lp + 0.5", "return jnp.sum(lp - lq + 0.5",
           "KL(pi_k || mu) of Gaussians wrong (kl_pi_mu, pi_old_kl)", "issue 44"),
    Mutant("head-entropy-one-dim", _HEADS,
           "+ 0.5 * self.action_dim * (1.0 + math.log(2 * math.pi))",
           "+ 0.5 * (1.0 + math.log(2 * math.pi))",
           "the entropy bonus of an m-d Gaussian counts the constant once", "issue 44"),
    Mutant("head-no-clip-to-box", _HEADS, "return jnp.clip(u, low, high)", "return u",
           "the env receives actions outside its box", "issue 44"),
    Mutant("head-interpolate-alpha-swapped", _HEADS,
           "prec_m, prec_p = (1.0 - alpha) * jnp.exp(-2 * lm), alpha * jnp.exp(-2 * lp)",
           "prec_m, prec_p = alpha * jnp.exp(-2 * lm), (1.0 - alpha) * jnp.exp(-2 * lp)",
           "A-3PO's proximal Gaussian leans toward mu as the lag grows", "issue 44"),
    Mutant("setup-mlp-actor-on-lqr", "vccc_jax/train/setup.py",
           '() if kind == "lqr" else hidden', "hidden",
           "lqr: runs with an MLP actor: V^pi no longer exact", "issue 44", _CONT),
    Mutant("lqr-truth-noise-scale-dropped", "vccc_jax/train/exact_metrics.py",
           "linear_gaussian(p, log_noise_scale)", "linear_gaussian(p)",
           "exact_err_mu / exact_err_mix at the unscaled behaviour", "issue 44", _CONT),
    Mutant("lqr-mixture-weights-ignored", "vccc_jax/tabular/lqr.py", "return weights @ outs",
           "return outs.mean(0)", "V^{mubar} of the uniform, not the logged, version mix",
           "issue 44", _CONT),
    Mutant("config-z-refusal-gone", "vccc_jax/train/config.py",
           "row.uses_z and action_dim(cfg.env) != 1", "row.uses_z and action_dim(cfg.env) == 0",
           "Z-centred targets accepted on m > 1 Gaussian actions (no closed form): a crash "
           "after compiling", "issue 44", _CONT),
    # ---------------------------------------------------------------- issue 28: per-env rollout
    Mutant("rollout-lag0-where", "vccc_jax/envs/acting.py",
           "return jnp.where((lag == 0)[..., None], own_log_probs,",
           "return jnp.where((lag == 1)[..., None], own_log_probs,",
           "on the per-env and sorted paths lag-1 envs log their own version as pi_k (log-ratio "
           "0); lag-0 log-ratios no longer exactly 0 where the kernels round differently", "i28"),
    Mutant("lag-env-versions-slot", "vccc_jax/envs/acting.py",
           "params=gather(buffer, lags), newest=get(buffer, 0),",
           "params=gather(buffer, lags + 1), newest=get(buffer, 0),",
           "every per-env version one update older than its logged lag", "i28",
           ("tests/envs/test_acting.py",)),
    Mutant("lag-sorted-pick-offset", "vccc_jax/envs/acting.py",
           "pick_sorted = (start[i // chunk] + sl - lo[i // chunk]) * chunk + i % chunk",
           "pick_sorted = (start[i // chunk] + sl - lo[i // chunk]) * chunk",
           "every env on the sorted path acts on its chunk's first env's observation", "i28",
           ("tests/envs/test_acting.py",)),
    # ---------------------------------------------------------------- issue 27's table
    Mutant("learner-log-rhos-sign", "vccc_jax/train/learner.py",
           "log_rhos=log_pi_old - log_mu,", "log_rhos=log_mu - log_pi_old,",
           "every corrected critic target and actor weight of the trainer", "issue 27", _TRAINER),
    Mutant("targets-z-pi-mu-swapped", "vccc_jax/envs/policy_heads.py",
           "return importance.expected_weight(rows_pi, rows_mu, kind=kind, clip=clip)",
           "return importance.expected_weight(rows_mu, rows_pi, kind=kind, clip=clip)",
           "every Z-centred target of the trainer biased", "issue 27", _TRAINER),
    Mutant("sampler-mask-inverted", "vccc_jax/envs/samplers.py",
           "z = jnp.where(mask, z, -jnp.inf)", "z = jnp.where(~mask, z, -jnp.inf)",
           "the sampler emits only banned tokens", "issue 27"),
    Mutant("byo-any-signed-bias", "vccc_jax/verify/user_one_step.py",
           'u.claim.name == "any" and float(np.max(np.abs(bias))) <= EXACT_TOL',
           'u.claim.name == "any" and float(np.max(bias)) <= EXACT_TOL',
           "--claim any passes a user estimator whose bias is <= 0 everywhere", "issue 27", _BYO),
    Mutant("byo-fixed-point-mask-inverted", "vccc_jax/verify/user_one_step.py",
           "np.max(np.where(np.asarray(e.claim_ok),", "np.max(np.where(~np.asarray(e.claim_ok),",
           "the user's fixed-point row always passes", "issue 27", _BYO),
    Mutant("critic-free-groups-transposed", "vccc_jax/train/critic_free.py",
           "batch.returns.reshape(cfg.groups, cfg.group_size)",
           "batch.returns.reshape(cfg.group_size, cfg.groups)",
           "GRPO baselines mix prompts", "issue 27"),
    Mutant("critic-free-kept-normaliser", "vccc_jax/train/critic_free.py",
           "n_live = jnp.maximum(jnp.sum(batch.policy_step, 0), 1)",
           "n_live = jnp.maximum(jnp.sum(ps_ppo.prefix_weights(cutoffs, surv, batch.policy_step)"
           " > 0, 0), 1)",
           "PS-PPO loss normalised by kept steps: a biased gradient", "issue 27"),
    Mutant("polyak-swapped", "vccc_jax/train/trainer.py",
           "lambda t, p: (1.0 - tau) * t + tau * p", "lambda t, p: tau * t + (1.0 - tau) * p",
           "the target critic barely moves (tests use tau = 0.5 only)", "issue 27",
           ("tests/train/test_chunked_runs.py",)),
    Mutant("minibatch-contiguous", "vccc_jax/train/learner.py",
           "x = x.reshape((T * n // num_minibatches, num_minibatches) + x.shape[2:])",
           "x = jnp.swapaxes(x.reshape((num_minibatches, T * n // num_minibatches)"
           " + x.shape[2:]), 0, 1)",
           "minibatches are blocks of envs, not every env in each", "issue 27", _TRAINER),
    Mutant("lag-table-available", "vccc_jax/envs/acting.py",
           "complete: bool) -> VersionTable:\n"
           "    lags = jnp.clip(jnp.asarray(lags, jnp.int32), 0, available(buffer) - 1)",
           "complete: bool) -> VersionTable:\n"
           "    lags = jnp.clip(jnp.asarray(lags, jnp.int32), 0, available(buffer))",
           "wrong recorded lag in the first K - 1 updates", "issue 27"),
    Mutant("lag-switch-early", "vccc_jax/envs/lag.py",
           "hops = (jnp.asarray(step, jnp.int32) // every) * stride",
           "hops = ((jnp.asarray(step, jnp.int32) + 1) // every) * stride",
           "mid-rollout switches one step early", "issue 27"),
    Mutant("sharded-scan-offset", "vccc_jax/train/trainer.py",
           "s, m = update(setup, values, s, start + i)", "s, m = update(setup, values, s, i)",
           "chunked / resumed runs replay the lag-law and ground-truth cadence from 0",
           "issue 27", ("tests/train/test_chunked_runs.py",)),
    # ---------------------------------------------------------------- added here: train/
    Mutant("adv-normalise-wrong-axis", "vccc_jax/train/learner.py",
           "mean = jnp.mean(adv, axis=1, keepdims=True)",
           "mean = jnp.mean(adv, axis=0, keepdims=True)",
           "advantages centred across minibatches, not within each", tests=_TRAINER),
    Mutant("replay-lag-sign", "vccc_jax/train/replay.py",
           'stored_lag = current_version - d["version"]',
           'stored_lag = d["version"] - current_version',
           "replayed columns record negative lags",
           tests=("tests/train/test_trainer_protocol.py",)),
    Mutant("replay-valid-order", "vccc_jax/train/replay.py",
           "jnp.repeat(buffer.valid.astype(jnp.float32), b)",
           "jnp.tile(buffer.valid.astype(jnp.float32), b)",
           "empty replay slots weighted as full ones (and full ones dropped)",
           tests=("tests/train/test_trainer_protocol.py",)),
    Mutant("critic-free-length-ema-swapped", "vccc_jax/train/critic_free.py",
           "cfg.length_ema * state.lengths\n"
           "                            + (1 - cfg.length_ema) * mean_len",
           "(1 - cfg.length_ema) * state.lengths\n"
           "                            + cfg.length_ema * mean_len",
           "the per-prompt length estimate (the cutoff law's scale) follows the wrong weight"),
    Mutant("critic-free-kept-fraction", "vccc_jax/train/critic_free.py",
           '"kept_fraction": (count - overflow) / live', '"kept_fraction": count / live',
           "the kept-token fraction reported counts tokens dropped by the budget"),
    # ---------------------------------------------------------------- envs/
    Mutant("lag-uniform-off-by-one", "vccc_jax/envs/lag.py",
           "p = (k <= self.param).astype(np.float64)", "p = (k < self.param).astype(np.float64)",
           "uniform:M draws lags 0..M-1 (mean and exact-truth weights wrong)"),
    Mutant("lag-switch-ignores-stride", "vccc_jax/envs/lag.py",
           "hops = (jnp.asarray(step, jnp.int32) // every) * stride",
           "hops = jnp.asarray(step, jnp.int32) // every",
           "mid-rollout switches always one version newer, whatever the stride"),
    Mutant("lag-ring-slot-sign", "vccc_jax/envs/lag.py",
           "return (buffer.head - lags) % buffer.num_versions",
           "return (buffer.head + lags) % buffer.num_versions",
           "lag l reads a version from the future side of the ring"),
    Mutant("lag-trace-position", "vccc_jax/envs/lag.py",
           "idx = (step * num_envs + jnp.arange(num_envs, dtype=jnp.int32)) % len(self.trace)",
           "idx = (step + jnp.arange(num_envs, dtype=jnp.int32)) % len(self.trace)",
           "trace:... replays the measured lags out of order"),
    Mutant("rollout-draws-one-key", "vccc_jax/envs/rollout.py",
           "k_act, k_env = both[:, 0], both[:, 1]", "k_act, k_env = both[:, 0], both[:, 0]",
           "actions and env steps drawn from one key: the action noise and the env's own "
           "draws (resets) are correlated", "i28"),
    Mutant("rollout-truncation-zero-discount", "vccc_jax/envs/rollout.py",
           "return gamma * (1.0 - self.terminated.astype(self.reward.dtype))",
           "return gamma * (1.0 - (self.terminated | self.truncated).astype(self.reward.dtype))",
           "time-limit cuts treated as terminal: no bootstrap at the cut"),
    Mutant("sampler-top-p-off-by-one", "vccc_jax/envs/samplers.py",
           "before = jnp.cumsum(probs, axis=-1) - probs", "before = jnp.cumsum(probs, axis=-1)",
           "top-p keeps one token too few (the logged mu is not what a top-p engine samples)"),
    Mutant("sampler-temperature-multiplies", "vccc_jax/envs/samplers.py",
           "z = z if spec.temperature == 1.0 else z / spec.temperature",
           "z = z if spec.temperature == 1.0 else z * spec.temperature",
           "temperature T acts as 1 / T"),
    # ---------------------------------------------------------------- runs/
    Mutant("sweep-se-ddof", "vccc_jax/runs/tabular_sweep.py",
           "v.std(ddof=1) / np.sqrt(n)", "v.std(ddof=0) / np.sqrt(n)",
           "standard errors of every sweep metric too small",
           tests=("tests/runs/test_results.py",)),
    Mutant("sweep-by-lag-order", "vccc_jax/runs/tabular_sweep.py",
           'm["ess_by_lag"] = out["ess_by_version"].mean(0)[::-1].tolist()',
           'm["ess_by_lag"] = out["ess_by_version"].mean(0).tolist()',
           "ESS by lag stored oldest-first (index != lag)",
           tests=("tests/runs/test_results.py",)),
    Mutant("store-drops-last-row", "vccc_jax/runs/store.py",
           'end = data.rfind(b"\\n") + 1  # 0 when', 'end = data.rfind(b"\\n")  # 0 when',
           "the last complete row of a result store is dropped (and recomputed on resume)"),
    Mutant("progress-eta-inverted", "vccc_jax/runs/progress.py",
           "return (self.total - self.done) * max(seconds, 1e-9) / computed",
           "return self.done * max(seconds, 1e-9) / computed",
           "the ETA grows as the run nears its end"),
    # ---------------------------------------------------------------- verify/
    Mutant("verify-maxabs-signed", "vccc_jax/verify/problems.py",
           "return jnp.max(jnp.abs(x))", "return jnp.max(x)",
           "every exact check misses errors that are negative everywhere", tests=_BYO),
    Mutant("verify-binomial-level", "vccc_jax/verify/stats.py",
           "int(stats.binom.ppf(1.0 - alpha, n, p))", "int(stats.binom.ppf(alpha, n, p))",
           "the |z| > 3.29 count bound at the wrong tail: correct targets fail",
           tests=("tests/verify/test_verify.py",)),
    Mutant("verify-truncated-policy-no-c", "vccc_jax/verify/problems.py",
           "m = jnp.minimum(c * mu, pi)\n    z = jnp.sum(m, axis=-1)\n    return z, m / z[:, None]",
           "m = jnp.minimum(mu, pi)\n    z = jnp.sum(m, axis=-1)\n    return z, m / z[:, None]",
           "the clipped claims computed at c = 1", tests=_BYO),
    Mutant("byo-fixed-point-any-mdp", "vccc_jax/verify/user_one_step.py",
           "bool(np.all(e <= FIXED_TOL))", "bool(np.any(e <= FIXED_TOL))",
           "the user's fixed-point row passes when one MDP does", tests=_BYO),
)
