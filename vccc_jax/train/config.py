"""The trainer's run configuration (frozen; saved next to every result).

Fields cover the PureJaxRL PPO defaults, the simulated lag (``envs.lag``), the critic
target (a name of ``train.targets.CRITIC_TARGETS``: the canonical names of
``estimators.registry`` plus the trainer-only ``gae``), the actor's weight kind with
optional score centering (Eq 13), and the ground-truth evaluation.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

# The validators below import JAX; they are imported where used, so that importing this
# module (the fields and their defaults) is pure Python: ``vccc train`` reports bad input
# before importing JAX (issue 23).

# The Eq 10 actor kinds that take score centring (``centered-...``); ``actor`` accepts every
# row of ``estimators.actor_registry`` (issue 21).
ACTOR_KINDS = ("ratio", "truncate", "mask")
ADVANTAGES = ("gae", "target")
BASELINES = ("value", "zero", "learned")
GT_KINDS = ("auto", "mc", "exact")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a run (frozen; saved next to every result).

    Defaults reproduce the PureJaxRL CartPole PPO configuration (4 envs x 128 steps,
    4 epochs x 4 minibatches, 64-unit tanh MLPs, lr 2.5e-4 annealed, GAE(0.99, 0.95)).
    """

    env: str = "CartPole-v1"
    num_envs: int = 4
    num_steps: int = 128
    total_timesteps: int = 500_000
    update_epochs: int = 4
    num_minibatches: int = 4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    actor_lr: float = 2.5e-4
    critic_lr: float = 2.5e-4
    anneal_lr: bool = True
    max_grad_norm: float = 0.5
    ppo_epsilon: Optional[float] = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    hidden: int = 64
    num_layers: int = 2
    activation: str = "tanh"
    normalize_advantages: bool = True
    # simulated lag
    lag: str = "fixed:0"
    num_versions: Optional[int] = None  # ring size K; None: from the lag law (1 = synchronous)
    switch_every: int = 0  # mid-rollout weight switches every m steps (0: off)
    switch_stride: int = 1  # versions gained per switch
    temperature: float = 1.0  # behaviour sampling temperature (logged in log mu)
    top_k: int = 0  # behaviour top-k sampling (0: off)
    noise_scale: float = 1.0  # continuous actions: the behaviour samples from std x noise_scale
    squash: bool = False  # continuous actions: tanh-squash into the box (else clip to it)
    # critic
    critic: str = "gae"  # a key of train.targets.CRITIC_TARGETS
    critic_lambda: Optional[float] = None  # lambda of gae / vtrace targets (None: gae_lambda)
    clip: float = 2.0  # weight clip c of truncated / masked / *_baseline targets
    clip_kind: str = "truncate"  # weight kind of the ratio diagnostics: truncate | mask
    baseline: str = "value"  # b(s) of vccc / *_baseline targets: value (Vbar) | zero
    rho_bar: float = 1.0  # V-trace rhobar
    c_bar: float = 1.0  # V-trace cbar
    vtrace_n: Optional[int] = None  # V-trace n-step window (None: whole rollout)
    correct: bool = True  # False: ignore log mu, treat data as on-policy (rho := 1)
    polyak: Optional[float] = None  # target-critic Polyak rate tau (None: Vbar = critic)
    # actor
    actor: str = "truncate"  # [centered-]ratio | truncate | mask, or any actor_registry row (issue 21)
    actor_clip: float = 2.0
    actor_params: str = ""  # the row's other parameters, e.g. "alpha=0.5,beta=5" (train.actor_weights)
    advantage: str = "gae"  # gae | target
    centering_topk: int = 0  # centred actor: Z(s) / m_w from the top-k of mu + tail model (0: full rows)
    # ground truth / evaluation
    gt_every: int = 0  # every N updates (0: off)
    gt_states: int = 8
    gt_rollouts: int = 8
    gt_horizon: Optional[int] = None  # None: gamma^H <= 0.01
    eval_envs: int = 8  # current-policy episodes at each ground-truth update (0: off)
    # samplers, exact truth, training protocol (issues 11/12; Sec 4.2, Eq 6, Eq 9)
    sampler: str = ""  # envs.samplers.SamplerSpec text, e.g. "temp=0.7,k=50,p=0.9" ("": temperature/top_k)
    gt_kind: str = "auto"  # auto (exact on tabular:/token: envs, else mc) | mc | exact
    critic_first: bool = False  # critic phase first; actor then uses the UPDATED critic
    critic_steps: int = 1  # epochs of the critic phase per update (critic_first only)
    replay_updates: int = 0  # R: keep each rollout R more updates and replay it (Eq 6)
    baseline_lr: Optional[float] = None  # lr of the learned b_psi head (None: critic_lr)
    # seeds
    seed: int = 0
    num_seeds: int = 1
    # comparators (issue 13; check_comparators below validates them)
    brace_n: int = 4  # --critic brace: policy steps in the importance-corrected prefix
    brace_tail_anchor: str = "prefix"  # brace tail weight: prefix (trace product) | constant (1)
    pi_old_route: str = ""  # actor pi_old: "" (off: pi_k) | exact | ewma | behaviour | interpolated
    ewma_decay: Optional[float] = None  # PPO-EWMA beta (None: L / (1 + L), L the lag law's mean)

    def __post_init__(self):
        def need(cond, msg):
            if not cond:
                raise ValueError(msg)

        from vccc_jax.envs import lag as lag_lib
        from vccc_jax.estimators import importance
        from vccc_jax.train import actor_weights

        need(self.num_envs >= 1, f"num_envs must be >= 1, got {self.num_envs}")
        need(self.num_steps >= 1, f"num_steps must be >= 1, got {self.num_steps}")
        need(self.update_epochs >= 1, f"update_epochs must be >= 1, got {self.update_epochs}")
        need(
            self.num_minibatches >= 1
            and (self.num_envs * self.num_steps) % self.num_minibatches == 0,
            f"num_minibatches={self.num_minibatches} must divide num_envs * num_steps = "
            f"{self.num_envs * self.num_steps}",
        )
        need(self.total_timesteps >= self.num_envs * self.num_steps,
             f"total_timesteps={self.total_timesteps} is less than one update "
             f"({self.num_envs * self.num_steps} steps)")
        need(0 <= self.gamma <= 1, f"gamma must be in [0, 1], got {self.gamma}")
        need(0 <= self.gae_lambda <= 1, f"gae_lambda must be in [0, 1], got {self.gae_lambda}")
        need(self.critic_lambda is None or 0 <= self.critic_lambda <= 1,
             f"critic_lambda must be in [0, 1], got {self.critic_lambda}")
        need(self.clip_kind in ("truncate", "mask"),
             f"clip_kind must be truncate or mask, got {self.clip_kind!r}")
        need(self.baseline in BASELINES,
             f"baseline must be one of {BASELINES}, got {self.baseline!r}")
        need(self.advantage in ADVANTAGES,
             f"advantage must be one of {ADVANTAGES}, got {self.advantage!r}")
        need(self.polyak is None or 0 < self.polyak <= 1,
             f"polyak must be in (0, 1] or None, got {self.polyak}")
        need(self.ppo_epsilon is None or 0 < self.ppo_epsilon < 1,
             f"ppo_epsilon must be in (0, 1) or None, got {self.ppo_epsilon}")
        need(self.num_seeds >= 1, f"num_seeds must be >= 1, got {self.num_seeds}")
        need(self.gt_every >= 0, f"gt_every must be >= 0, got {self.gt_every}")
        need(self.gt_rollouts >= 2, f"gt_rollouts must be >= 2, got {self.gt_rollouts}")
        need(self.gt_states >= 1, f"gt_states must be >= 1, got {self.gt_states}")
        need(self.eval_envs >= 0, f"eval_envs must be >= 0, got {self.eval_envs}")
        need(self.switch_every >= 0, f"switch_every must be >= 0, got {self.switch_every}")
        need(self.switch_stride >= 1, f"switch_stride must be >= 1, got {self.switch_stride}")
        need(self.temperature > 0, f"temperature must be > 0, got {self.temperature}")
        need(self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}")
        need(self.rho_bar > 0 and self.c_bar > 0, "rho_bar and c_bar must be > 0")
        need(self.vtrace_n is None or self.vtrace_n >= 1,
             f"vtrace_n must be >= 1 or None, got {self.vtrace_n}")
        need(self.gt_kind in GT_KINDS, f"gt_kind must be one of {GT_KINDS}, got {self.gt_kind!r}")
        need(self.critic_steps >= 1, f"critic_steps must be >= 1, got {self.critic_steps}")
        need(self.replay_updates >= 0, f"replay_updates must be >= 0, got {self.replay_updates}")
        need(self.baseline_lr is None or self.baseline_lr > 0,
             f"baseline_lr must be > 0 or None, got {self.baseline_lr}")
        if self.sampler:
            need(self.temperature == 1.0 and self.top_k == 0,
                 "sampler is set: give temperature / top_k inside it (e.g. sampler='temp=0.7,k=5')")
            self.sampler_spec  # parses (ValueError names the bad item)
        actor_kind, centered = parse_actor(self.actor)
        need(isinstance(self.centering_topk, int) and not isinstance(self.centering_topk, bool)
             and self.centering_topk >= 0,
             f"centering_topk must be an int >= 0, got {self.centering_topk!r}")
        need(self.centering_topk == 0 or centered,
             f"centering_topk={self.centering_topk} needs a centred actor "
             f"(actor='centered-...'), got actor={self.actor!r}")
        if actor_kind in ("truncate", "mask"):
            try:
                importance.check_weight_kind(actor_kind, self.actor_clip)
            except ValueError as err:
                raise ValueError(f"actor_clip: {err}") from None
        actor_weights.resolve(actor_kind, self.actor_params, self.actor_clip)  # names actor_params
        need(actor_kind in ACTOR_KINDS or not self.pi_old_route or self.gt_every == 0,
             f"pi_old_route diagnostics (gt_every > 0) need actor in {ACTOR_KINDS}, got {self.actor!r}")
        try:
            importance.check_weight_kind(self.clip_kind, self.clip)
        except ValueError as err:
            raise ValueError(f"clip: {err}") from None
        need(self.noise_scale > 0, f"noise_scale must be > 0, got {self.noise_scale}")
        law = lag_lib.LagLaw.parse(self.lag)
        law.check(self.resolved_num_versions)

        check_comparators(self)
        check_action_space(self)
        from vccc_jax.estimators.related.field_critics import NEEDS_ACTOR_CRITIC

        need(self.critic not in NEEDS_ACTOR_CRITIC or self.replay_updates == 0,
             f"critic {self.critic!r} reads the actor's critic copy of each rollout, which the "
             "replay buffer does not keep: use replay_updates=0")

    @property
    def resolved_num_versions(self) -> int:
        from vccc_jax.envs import lag as lag_lib

        if self.num_versions is not None:
            return int(self.num_versions)
        return lag_lib.LagLaw.parse(self.lag).default_num_versions()

    @property
    def sampler_spec(self):
        """The behaviour sampler (``envs.samplers.SamplerSpec``) or None: plain
        temperature / top_k sampling through ``rollout.sampling_log_probs`` (old numbers)."""
        if not self.sampler:
            return None
        from vccc_jax.envs import samplers

        try:
            return samplers.SamplerSpec.parse(self.sampler)
        except ValueError as err:
            raise ValueError(f"sampler {self.sampler!r}: {err}") from None

    @property
    def lag_law(self):
        """The lag law (``envs.lag.LagLaw``) of ``lag``."""
        from vccc_jax.envs import lag as lag_lib

        return lag_lib.LagLaw.parse(self.lag)

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // (self.num_envs * self.num_steps)

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def target_lambda(self) -> float:
        return self.gae_lambda if self.critic_lambda is None else self.critic_lambda

    def replace(self, **changes) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown TrainConfig fields: {unknown}")
        return cls(**d)


def parse_actor(spec: str) -> tuple[str, bool]:
    """``"centered-mask"`` -> ("mask", True); ``"truncate"`` -> ("truncate", False); any row
    of ``estimators.actor_registry`` by name or alias (``"gspo"`` -> ("gspo", False)). Score
    centring (Eq 13) is defined for the Eq 10 kinds ``ACTOR_KINDS``."""
    from vccc_jax.estimators import actor_registry

    text = spec.strip().lower()
    centered = text.startswith("centered-")
    kind = text[len("centered-"):] if centered else text
    try:
        kind = actor_registry.get_actor_correction(kind).name
    except ValueError:
        raise ValueError(f"actor must be [centered-]{{{'|'.join(ACTOR_KINDS)}}} or a row of the "
                         f"actor table {sorted(actor_registry.ACTOR_CORRECTIONS)}, got {spec!r}") from None
    if centered and kind not in ACTOR_KINDS:
        raise ValueError(f"actor {spec!r}: score centring needs one of {ACTOR_KINDS}")
    return kind, centered


def continuous_actions(env: str) -> bool:
    """Pure Python: does ``env`` have continuous actions (``envs.spec.continuous_actions``)?
    The trainer's policy head follows (``train.setup``)."""
    from vccc_jax.envs.spec import continuous_actions as continuous

    return continuous(env)


def action_dim(env: str) -> Optional[int]:
    """The action dimension of a continuous env known from its name (None: brax, unknown
    before the env is built)."""
    from vccc_jax.envs.spec import CONTINUOUS_GYMNAX, env_kind, parse_lqr_spec

    if env_kind(env) == "lqr":
        return int(parse_lqr_spec(env)["act"])
    return 1 if env in CONTINUOUS_GYMNAX else None


def check_action_space(cfg: "TrainConfig") -> None:
    """ValueError (one line, with its mathematical reason) for an option that the env's action
    space cannot have; pure Python, so it fires when the config is parsed, before any compile."""
    from vccc_jax.estimators import registry

    if not continuous_actions(cfg.env):
        if cfg.noise_scale != 1.0 or cfg.squash:
            raise ValueError(f"noise_scale / squash shape a Gaussian policy; {cfg.env!r} has "
                             "discrete actions (use temperature or sampler)")
        return
    finite = "a finite action set; continuous actions have a density on R^m (use noise_scale)"
    if cfg.sampler or cfg.temperature != 1.0 or cfg.top_k:
        raise ValueError(f"sampler / temperature / top_k reshape a categorical row over {finite}")
    if parse_actor(cfg.actor)[1]:
        raise ValueError("score centring (Eq 13) sums C(a) grad log pi(a) over a finite action "
                         "set; for a Gaussian with clipped weights that integral has no closed "
                         "form (use an uncentred actor)")
    if cfg.critic == "vccc_bstar":
        raise ValueError("vccc_bstar needs the per-state b* of Eq 9, counted over the visits of "
                         "a finite state set (tabular envs only)")
    row = registry.CRITIC_TARGETS.get(cfg.critic)
    if row is not None and row.uses_z and action_dim(cfg.env) != 1:
        raise ValueError(f"critic {cfg.critic!r} needs Z(s) = E_mu[min(rho, c)]: closed form "
                         "for 1-d Gaussian actions only ({rho <= c} is a quadric in R^m, not a "
                         f"product of per-dimension sets); {cfg.env!r} has "
                         f"{action_dim(cfg.env) or 'm > 1 (brax)'} action dims")


def check_comparators(cfg: "TrainConfig") -> None:
    """ValueError naming the field for a bad comparator field of ``cfg`` (issue 13)."""
    from vccc_jax.estimators.related.brace import TAIL_ANCHORS
    from vccc_jax.estimators.related.decoupled import ROUTES

    if isinstance(cfg.brace_n, bool) or not isinstance(cfg.brace_n, int) or cfg.brace_n < 0:
        raise ValueError(f"brace_n must be an int >= 0, got {cfg.brace_n!r}")
    if cfg.brace_tail_anchor not in TAIL_ANCHORS:
        raise ValueError(f"brace_tail_anchor must be one of {TAIL_ANCHORS}, got "
                         f"{cfg.brace_tail_anchor!r}")
    if cfg.pi_old_route not in ("",) + ROUTES:
        raise ValueError(f"pi_old_route must be '' (off) or one of {ROUTES}, got {cfg.pi_old_route!r}")
    if cfg.ewma_decay is not None and not 0 <= cfg.ewma_decay < 1:
        raise ValueError(f"ewma_decay must be in [0, 1) or None, got {cfg.ewma_decay}")
