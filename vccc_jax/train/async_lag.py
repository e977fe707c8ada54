"""The lag a real asynchronous pipeline produces, measured (issue 48, host-side numpy).

Every transition the actors produce is stamped with its behaviour version (the version of the
parameters its actor held); the learner at version k sees lag ``k - version``. Per update:

* over transitions: ``version_diff_min`` / ``version_diff_avg`` / ``version_diff_max``
  (Sample Factory's names) and the histogram ``lag_hist<j>`` (share of the batch's
  transitions at lag j; the last bin holds lag >= ``HIST_BINS - 1``);
* over trajectories (episodes, which cross rollouts and so may cross versions) finished in
  the batch: ``traj_staleness_min`` / ``_avg`` / ``_max`` of their step-weighted mean lag
  (verl's token-weighted trajectory staleness), ``traj_lag_hist<j>`` of their oldest step's
  lag, ``traj_multi_version_frac`` (the share whose steps come from more than one version),
  ``lag_len_corr`` (Pearson correlation of a trajectory's mean lag with its length: fast
  episodes over-represented?); NaN where undefined (no trajectory, constant lags).

:class:`LagTrace` keeps the per-(update, env) lags in the order the simulator's ``trace`` law
(``envs.lag.LagLaw``) reads them: env b at update k gets ``trace[k * num_envs + b]``, written
``L/d1/d2`` when the learner dropped rollouts of that env acting at lags d1, d2 (``bounded:N``)
before the one it learned at lag L.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIST_BINS = 8
TRACE_FILE = "lags.trace"

__all__ = ["HIST_BINS", "LagTrace", "TRACE_FILE", "TrajectoryLags", "drop_lags", "histogram",
           "pearson", "transition_metrics"]


def histogram(lags: np.ndarray, bins: int = HIST_BINS) -> np.ndarray:
    """Share of ``lags`` at 0, 1, ..., bins - 2 and >= bins - 1 (float64 [bins]; 0s if empty)."""
    lags = np.asarray(lags).reshape(-1)
    counts = np.bincount(np.minimum(lags, bins - 1).astype(np.int64), minlength=bins)
    return counts / max(lags.size, 1)


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation of two equal-length vectors; NaN with < 2 points or a constant one."""
    x, y = np.asarray(x, np.float64).reshape(-1), np.asarray(y, np.float64).reshape(-1)
    if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def transition_metrics(lag: np.ndarray) -> dict:
    """version_diff_min / avg / max and lag_hist<j> over a batch's transitions."""
    lag = np.asarray(lag)
    out = {"version_diff_min": int(lag.min()), "version_diff_avg": float(lag.mean()),
           "version_diff_max": int(lag.max())}
    out.update({f"lag_hist{j}": float(h) for j, h in enumerate(histogram(lag))})
    return out


class TrajectoryLags:
    """Running per-env accumulators of the episode in progress (its oldest and newest
    behaviour version, lag sum, steps); :meth:`update` folds in one batch and returns the
    metrics of the episodes finished in it. Its state is host numpy (:meth:`state` /
    :meth:`load` for checkpoints)."""

    def __init__(self, num_envs: int):
        self.vmin = np.full((num_envs,), np.iinfo(np.int64).max, np.int64)
        self.vmax = np.full((num_envs,), -1, np.int64)
        self.lag_sum = np.zeros((num_envs,), np.float64)
        self.lag_max = np.zeros((num_envs,), np.int64)
        self.steps = np.zeros((num_envs,), np.int64)

    def state(self) -> dict:
        return {k: getattr(self, k).tolist() for k in ("vmin", "vmax", "lag_sum", "lag_max",
                                                        "steps")}

    def load(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, np.asarray(v, getattr(self, k).dtype))

    def update(self, version: np.ndarray, lag: np.ndarray, done: np.ndarray) -> dict:
        """Fold in a [T, B] batch (behaviour version, lag, episode end) in time order."""
        mean_lag, lag_max, multi, length = [], [], [], []
        for t in range(version.shape[0]):
            v, g = version[t].astype(np.int64), lag[t].astype(np.int64)
            self.vmin, self.vmax = np.minimum(self.vmin, v), np.maximum(self.vmax, v)
            self.lag_sum += g
            self.lag_max = np.maximum(self.lag_max, g)
            self.steps += 1
            ended = np.asarray(done[t], bool)
            if ended.any():
                mean_lag.append(self.lag_sum[ended] / self.steps[ended])
                lag_max.append(self.lag_max[ended])
                multi.append(self.vmax[ended] > self.vmin[ended])
                length.append(self.steps[ended])
                self.vmin[ended], self.vmax[ended] = np.iinfo(np.int64).max, -1
                self.lag_sum[ended], self.lag_max[ended], self.steps[ended] = 0.0, 0, 0
        cat = lambda xs, dt: np.concatenate(xs) if xs else np.zeros((0,), dt)  # noqa: E731
        mean_lag, lag_max = cat(mean_lag, np.float64), cat(lag_max, np.int64)
        multi, length = cat(multi, bool), cat(length, np.int64)
        nan = float("nan")
        out = {"trajectories": int(mean_lag.size),
               "traj_staleness_min": float(mean_lag.min()) if mean_lag.size else nan,
               "traj_staleness_avg": float(mean_lag.mean()) if mean_lag.size else nan,
               "traj_staleness_max": float(mean_lag.max()) if mean_lag.size else nan,
               "traj_multi_version_frac": float(multi.mean()) if multi.size else nan,
               "lag_len_corr": pearson(mean_lag, length)}
        hist = histogram(lag_max) if lag_max.size else np.full((HIST_BINS,), nan)
        out.update({f"traj_lag_hist{j}": float(h) for j, h in enumerate(hist)})
        return out


class LagTrace:
    """The measured per-(update, env) lags at the start of each rollout, one line per update,
    written as ``<run>/lags.trace``: ``--lag trace:@<run>/lags.trace`` replays them in the
    simulator with the same ``num_envs`` (env b at update k: entry k * num_envs + b). Where
    the learner dropped rollouts of env b before the learned one, the entry is ``L/d1/d2``:
    the lags (at update k: k - version) of the dropped rollouts, oldest first; the simulator
    advances env b through them before the learned rollout (``train.trainer.replay_drops``).
    ``drops``: per row, per env, those lags (None: nothing dropped yet, an old trace)."""

    def __init__(self, rows: list | None = None, drops: list | None = None):
        self.rows = [list(map(int, r)) for r in (rows or [])]
        self.drops = ([[list(map(int, d)) for d in r] for r in drops] if drops else
                      [[[] for _ in r] for r in self.rows])

    def add(self, lags_per_env: np.ndarray, drops_per_env: list | None = None) -> None:
        row = [int(x) for x in np.asarray(lags_per_env).reshape(-1)]
        self.rows.append(row)
        self.drops.append([list(map(int, d)) for d in drops_per_env] if drops_per_env
                          else [[] for _ in row])

    def lines(self) -> list[str]:
        return [" ".join("/".join(map(str, [lag] + d)) for lag, d in zip(r, ds))
                for r, ds in zip(self.rows, self.drops)]

    def write(self, out: Path) -> Path:
        path = Path(out) / TRACE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in self.lines()))
        tmp.replace(path)
        return path


def drop_lags(update: int, drop_versions: tuple, num_envs: int) -> list[list[int]]:
    """Per env, the lags at ``update`` of the rollouts dropped before the learned one, from a
    batch's per-actor ``drop_versions`` (env slices in actor order)."""
    if not drop_versions:
        return [[] for _ in range(num_envs)]
    per = num_envs // len(drop_versions)
    return [[update - v for v in drop_versions[b // per]] for b in range(num_envs)]
