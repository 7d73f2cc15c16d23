"""Skew-routed routers for tools/make_direct.py --skew: ffn_gate_inp written so that the model, on
ordinary English, routes with a real model's published expert popularity and token-to-token reuse.

A random router on a random-weight model routes almost uniformly: every expert gets ~k/n_expert of
the tokens and consecutive tokens share ~k^2/n_expert experts. Real routers do not. The router is
built from THIS model's hidden states, captured layer by layer in one teacher-forced prefill of
calibration texts (CALIBRATION_TEXTS: three genres, none the text tools/routing_stats.py measures on), each layer's
router written before that layer runs, so a layer's states are those the skewed layers below it
produce. For layer l with normed FFN inputs X f32[T, n_embd] (what the router multiplies):

  popularity  X has a strong mean direction u (|mean| is 60-90 % of the rms on these models; the
              projection x.u is ~7 standard deviations from 0 on every token): row e gets
              g * b_e * u / mean(x.u), a per-expert bias b_e from a Zipf-like profile (normal
              quantiles, assigned to experts in a seeded random order)
  reuse       the slowest features of X (slow feature analysis on its top PCA_DIMS principal
              components, orthogonal to u: the SLOW_DIMS directions with the highest lag-1
              autocorrelation) get random expert loadings, scaled by lam: experts that follow the
              context rather than the token
  the rest    the plain random router, orthogonal to u, scaled to unit logit std: per-token choice

g and lam are fitted per layer on the calibration states (a grid; the routing is computed exactly as
the engine's top-k of X @ W^T) to the profile's targets, averaged over the texts (the targets are
per-prompt figures: a mixed window would look flatter than any one text); tools/routing_stats.py then measures the
result on a held-out text.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PCA_DIMS = 48            # principal components of X (orthogonal to u) the slow features are sought in
SLOW_DIMS = 4            # slow features the context-following experts load on
G_GRID = np.linspace(0.1, 3.0, 30)
LAM_GRID = np.linspace(0.0, 4.0, 21)


@dataclass(frozen=True)
class SkewProfile:
    name: str
    top40: float             # share of a layer's activations taken by its most used 40 % of experts
    reuse: float             # share of a token's experts the next token picks again
    source: str


SKEWS = {
    # Qwen3-30B-A3B (128 experts, 8 used), measured by kekzl/imp on real weights, decode, 512-token prompts:
    # https://github.com/kekzl/imp/pull/1358: the per-prompt best 40 % of experts per layer cover 92.1 %
    # of activations (held-out, a set calibrated on other prompts: 67.6-72.6 %);
    # https://github.com/kekzl/imp/pull/1359: 45 % of selections repeat at the very next token, 80 %
    # within eight, LRU at 40 % residency hits 90.0-95.3 % in steady state.
    "qwen3-30b-a3b": SkewProfile("qwen3-30b-a3b", top40=0.921, reuse=0.45,
                                 source="kekzl/imp PR #1358 (top-40 % coverage 92.1 %, per prompt) and "
                                        "PR #1359 (45 % next-token reuse), Qwen3-30B-A3B decode"),
}

CALIBRATION_TEXTS = ((
    "The kitchen garden behind the old farmhouse was laid out in four square beds, divided by paths of "
    "crushed brick and edged with low box hedges. In spring the first bed was sown with peas and broad "
    "beans, which were staked with hazel twigs cut from the coppice at the bottom of the field. The "
    "second held onions, leeks and garlic, planted in rows so straight that visitors assumed a string "
    "had been used, although the gardener insisted he did it by eye. Carrots and parsnips went into the "
    "third bed, where the soil had been sieved to remove stones, and the fourth was left for potatoes, "
    "earthed up every fortnight as the green shoots appeared. Along the south-facing wall grew pears and "
    "plums trained into fans, their branches tied to wires with strips of cloth. Every evening in summer "
    "the beds were watered from a butt that collected rain from the barn roof, and in dry years the "
    "gardener carried buckets from the well, complaining that the cabbages drank more than the horses. "
    "Slugs were the constant enemy: he went out at dusk with a lantern and a tin, and the thrushes did "
    "the rest by day. At harvest the produce was weighed and recorded in a ledger, which shows that a "
    "good year brought in more than a ton of potatoes and enough onions to last until March. Surplus "
    "vegetables were sold at the market in the town on Saturdays, and the money paid for seed, tools "
    "and a new glass frame for raising tomatoes. Winter was spent digging manure into the empty beds, "
    "mending fences, sharpening blades and reading catalogues by the fire, planning next year's rotation "
    "so that no crop grew in the same ground two summers running. The ledger continues for forty years, "
    "in the same careful hand, until the last entry notes simply that the frost came early and the "
    "apples were picked in the rain."), (
    "\"Did you bring the cable?\" she asked, already kneeling by the rack. He handed it over and read the "
    "error aloud from his phone: the database replica had fallen four hours behind and the disk on the "
    "primary was ninety-six percent full. They agreed to stop the nightly report job first, because it "
    "wrote temporary tables that nobody cleaned up. Then they checked the logs, found a loop that retried "
    "a failed upload every second, and disabled it. \"Why didn't the alert fire earlier?\" he wondered. "
    "The threshold, it turned out, had been set to ninety-eight percent years ago and never reviewed. "
    "While the replica caught up, she wrote a short note for the morning team: what had happened, what "
    "they had switched off, and which settings should be changed before anyone turned it back on. By "
    "three o'clock the lag was under a minute, the disk had forty gigabytes free, and the coffee machine "
    "in the corridor had run out of milk, which both of them considered the more serious incident."), (
    "To make a simple loaf, mix five hundred grams of strong flour with ten grams of salt and seven grams "
    "of dried yeast, then add about three hundred and fifty millilitres of warm water and a spoonful of "
    "oil. Stir until the dough comes together, turn it out onto a floured surface and knead for ten "
    "minutes, until it is smooth and springs back when pressed. Leave it in a covered bowl somewhere warm "
    "for an hour or until it has doubled in size. Knock it back, shape it into a tight oval, place it in a "
    "greased tin and let it rise again for forty minutes. Bake at two hundred and twenty degrees for about "
    "thirty minutes; the loaf is done when it sounds hollow when tapped underneath. Cool it on a wire rack "
    "before slicing, otherwise the crumb will be gummy. Variations are easy: replace a third of the flour "
    "with wholemeal, add seeds or chopped olives, or brush the top with milk for a softer crust."))


def routing(L: np.ndarray, k: int) -> np.ndarray:
    """Selected experts of logits L f32[T, E] (the top k of each row) as a one-hot bool[T, E]."""
    top = np.argpartition(-L, k - 1, axis=1)[:, :k]
    M = np.zeros(L.shape, bool)
    np.put_along_axis(M, top, True, axis=1)
    return M


def popularity_reuse(M: np.ndarray, top: float = 0.4) -> tuple[float, float]:
    """(share of activations of the top `top` of experts, share of a token's experts the next reuses)."""
    cnt = np.sort(M.sum(0))[::-1]
    k = M[0].sum()
    return float(cnt[:round(top * M.shape[1])].sum() / cnt.sum()), float((M[1:] & M[:-1]).sum() / (k * (len(M) - 1)))


def skew_router(X: np.ndarray, W0: np.ndarray, k: int, profile: SkewProfile, rng: np.random.Generator,
                segments: list[slice] | None = None) -> tuple[np.ndarray, dict]:
    """The router f32[E, d] for hidden states X f32[T, d] (segments: runs of consecutive tokens, one per
    text; default all of X) and the plain random router W0 f32[E, d]; and the fit: g, lam and the
    calibration's top40 / reuse (means over the segments)."""
    segments = segments or [slice(0, len(X))]
    X = X.astype(np.float64)
    E, d = W0.shape
    mu = X.mean(0)
    u = mu / np.linalg.norm(mu)
    t = X @ u
    c = t.mean()
    Xp = X - np.outer(t, u)                                   # orthogonal to u: zero mean by construction
    R = W0.astype(np.float64)
    R -= np.outer(R @ u, u)
    F = Xp @ R.T
    R /= F.std()
    F /= F.std()
    _, _, Vt = np.linalg.svd(Xp, full_matrices=False)         # slow features within the top components
    m = min(PCA_DIMS, len(X) - 1, d)
    P = Vt[:m].T                                              # d x m
    Z = Xp @ P
    P = P / Z.std(0)
    Z = Z / Z.std(0)
    A = (Z[1:].T @ Z[:-1] + Z[:-1].T @ Z[1:]) / (2 * (len(Z) - 1))
    w, V = np.linalg.eigh(A)
    V = V[:, np.argsort(w)[::-1][:SLOW_DIMS]]
    D = P @ V                                                 # d x r: the slow features' read-out
    Zs = Xp @ D
    D /= Zs.std(0)
    G = rng.standard_normal((E, D.shape[1])) / np.sqrt(D.shape[1])
    S = Xp @ D @ G.T
    Ws = G @ D.T / S.std()
    S /= S.std()
    q = (np.arange(E) + 0.5) / E
    b = rng.permutation(_normal_quantile(q))                 # expert e's bias
    B = np.outer(t / c, b)
    best = None
    for g in G_GRID:
        for lam in LAM_GRID:
            M = routing(g * B + F + lam * S, k)
            top40, reuse = np.mean([popularity_reuse(M[sg]) for sg in segments], axis=0)
            err = (top40 - profile.top40) ** 2 + (reuse - profile.reuse) ** 2
            if best is None or err < best[0]:
                best = (err, g, lam, top40, reuse)
    _, g, lam, top40, reuse = best
    W = g * np.outer(b, u) / c + R + lam * Ws
    return W.astype(np.float32), {"g": float(g), "lam": float(lam), "top40": float(top40), "reuse": float(reuse),
                                  "mean_share": float(np.linalg.norm(mu) / np.sqrt((X ** 2).sum(1).mean()))}


def _normal_quantile(q: np.ndarray) -> np.ndarray:
    from statistics import NormalDist
    nd = NormalDist()
    return np.array([nd.inv_cdf(float(p)) for p in q])
