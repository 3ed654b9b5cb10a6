"""returns.py against slow, obviously-correct reference loops (one env, one step at a time)."""

from __future__ import annotations

import numpy as np
import pytest

from rltrain.data.returns import gae, nstep_returns, vtrace

T, N, GAMMA = 12, 5, 0.9


def _episode_data(seed: int):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    values = rng.normal(size=(T, N)).astype(np.float32)
    next_values = rng.normal(size=(T, N)).astype(np.float32)
    terminated = rng.random((T, N)) < 0.15
    truncated = (rng.random((T, N)) < 0.15) & ~terminated
    # make sure every case occurs: a termination and a truncation mid-rollout, and at the last row
    terminated[3, 0], truncated[5, 1], terminated[-1, 2], truncated[-1, 3] = True, True, True, True
    truncated[3, 0] = terminated[5, 1] = truncated[-1, 2] = terminated[-1, 3] = False
    # within an episode, next_obs[t] == obs[t + 1]: the successor's value is the next row's value
    for t in range(T - 1):
        cont = ~(terminated[t] | truncated[t])
        next_values[t, cont] = values[t + 1, cont]
    return rewards, values, next_values, terminated, truncated


def ref_gae(r, v, nv, term, trunc, gamma, lam):
    adv = np.zeros_like(r)
    for n in range(r.shape[1]):
        for t in range(r.shape[0]):
            total, coef = 0.0, 1.0
            for k in range(t, r.shape[0]):
                delta = r[k, n] + gamma * nv[k, n] * (0.0 if term[k, n] else 1.0) - v[k, n]
                total += coef * delta
                if term[k, n] or trunc[k, n]:
                    break
                coef *= gamma * lam
            adv[t, n] = total
    return adv, adv + v


def ref_nstep(r, nv, term, trunc, gamma):
    out = np.zeros_like(r)
    for n in range(r.shape[1]):
        for t in range(r.shape[0]):
            ret, disc = 0.0, 1.0
            for k in range(t, r.shape[0]):
                ret += disc * r[k, n]
                disc *= gamma
                if term[k, n]:
                    break
                if trunc[k, n] or k == r.shape[0] - 1:
                    ret += disc * nv[k, n]
                    break
            out[t, n] = ret
    return out


def ref_vtrace(log_rhos, r, v, nv, term, trunc, gamma, rho_bar, c_bar, pg_rho_bar):
    """Espeholt et al. eq. 1 written as the explicit sum over s >= t, one env at a time."""
    rhos = np.exp(log_rhos)
    vs = np.zeros_like(r)
    for n in range(r.shape[1]):
        for t in range(r.shape[0]):
            total, coef = 0.0, 1.0  # coef = gamma^(s-t) prod_{i<s} c_i
            for s in range(t, r.shape[0]):
                delta = min(rho_bar, rhos[s, n]) * (r[s, n] + gamma * nv[s, n] * (0.0 if term[s, n] else 1.0) - v[s, n])
                total += coef * delta
                if term[s, n] or trunc[s, n]:
                    break
                coef *= gamma * min(c_bar, rhos[s, n])
            vs[t, n] = v[t, n] + total
    pg = np.zeros_like(r)
    for n in range(r.shape[1]):
        for t in range(r.shape[0]):
            if term[t, n]:
                nxt = 0.0
            elif trunc[t, n] or t == r.shape[0] - 1:
                nxt = nv[t, n]
            else:
                nxt = vs[t + 1, n]
            pg[t, n] = min(pg_rho_bar, rhos[t, n]) * (r[t, n] + gamma * nxt - v[t, n])
    return vs, pg


@pytest.mark.parametrize("lam", [0.0, 0.8, 1.0])
def test_gae_matches_reference(lam):
    r, v, nv, term, trunc = _episode_data(0)
    adv, ret = gae(r, v, nv, term, trunc, gamma=GAMMA, lam=lam)
    ref_adv, ref_ret = ref_gae(r, v, nv, term, trunc, GAMMA, lam)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)


def test_nstep_matches_reference_and_gae_lambda_one():
    r, v, nv, term, trunc = _episode_data(1)
    ret = nstep_returns(r, nv, term, trunc, gamma=GAMMA)
    np.testing.assert_allclose(ret, ref_nstep(r, nv, term, trunc, GAMMA), rtol=1e-5, atol=1e-5)
    # GAE with lambda = 1 telescopes to the n-step return (values consistent within episodes)
    _, gae_ret = gae(r, v, nv, term, trunc, gamma=GAMMA, lam=1.0)
    np.testing.assert_allclose(ret, gae_ret, rtol=1e-4, atol=1e-4)


def test_termination_does_not_bootstrap_truncation_does():
    r = np.ones((1, 2), np.float32)
    nv = np.full((1, 2), 10.0, np.float32)
    ret = nstep_returns(r, nv, np.array([[True, False]]), np.array([[False, True]]), gamma=0.5)
    np.testing.assert_allclose(ret, [[1.0, 6.0]])


@pytest.mark.parametrize(("rho_bar", "c_bar", "pg_rho_bar"), [(1.0, 1.0, 1.0), (1.0, 0.9, 1.0), (2.0, 1.0, 0.5)])
def test_vtrace_matches_reference(rho_bar, c_bar, pg_rho_bar):
    r, v, nv, term, trunc = _episode_data(2)
    log_rhos = np.random.default_rng(3).normal(scale=0.7, size=(T, N)).astype(np.float32)
    vs, pg = vtrace(log_rhos, r, v, nv, term, trunc, gamma=GAMMA, rho_bar=rho_bar, c_bar=c_bar,
                    pg_rho_bar=pg_rho_bar)
    ref_vs, ref_pg = ref_vtrace(log_rhos, r, v, nv, term, trunc, GAMMA, rho_bar, c_bar, pg_rho_bar)
    np.testing.assert_allclose(vs, ref_vs, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pg, ref_pg, rtol=1e-4, atol=1e-4)


def test_vtrace_on_policy_equals_nstep_return():
    """rho = c = 1 (on-policy): v_s is the n-step bootstrapped return and the pg advantage its
    one-step-bootstrapped advantage r + gamma v_{s+1} - V (here equal to R - V)."""
    r, v, nv, term, trunc = _episode_data(4)
    vs, pg = vtrace(np.zeros((T, N), np.float32), r, v, nv, term, trunc, gamma=GAMMA)
    ret = nstep_returns(r, nv, term, trunc, gamma=GAMMA)
    np.testing.assert_allclose(vs, ret, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pg, ret - v, rtol=1e-4, atol=1e-4)
