"""Alpha-beta-gamma cost model of all-reduce algorithms, its calibration, and a scale simulator.

Based on: Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication
Operations in MPICH" (IJHPCA 2005) for the alpha-beta-gamma model and the
ring / halving-doubling / tree costs; Gibiansky (Baidu, 2017) for the single
reducer vs ring; Ying et al. (arXiv:1811.06992) for the 2-D torus.

A message of K bytes over one link costs alpha + K beta seconds; adding K bytes
costs K gamma. Each algorithm's time is a sum over its sequential steps, each
step paying for the slowest link used in it:

=================  ===============================================================
naive (1 reducer)  2(N-1)(alpha + K beta) + (N-1) K gamma
ring               2(N-1) alpha + 2(N-1)/N K beta + (N-1)/N K gamma
halving-doubling   2 log2(N) alpha + 2(N-1)/N K beta + (N-1)/N K gamma
binomial tree      2 log2(N) (alpha + K beta) + log2(N) K gamma
torus R x C        ring reduce-scatter + all-gather of K over C ranks on row links,
                   ring all-reduce of K/C over R ranks on column links
hierarchical       torus with rows = nodes (fast links) and columns = slow links
=================  ===============================================================

Changes the training math: no (a model of time only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALGORITHMS = ("naive", "ring", "halving_doubling", "tree", "torus", "native")


@dataclass(frozen=True)
class Link:
    """alpha: seconds per message; beta: seconds per byte; gamma: seconds per byte summed."""
    alpha: float
    beta: float
    gamma: float = 0.0

    @property
    def gbit_per_s(self) -> float:
        return 8e-9 / self.beta if self.beta > 0 else math.inf


@dataclass(frozen=True)
class Network:
    """Ranks in nodes of ``local_size`` consecutive ranks: ``intra`` links inside a node,
    ``inter`` between nodes. One level: ``Network(link)`` (inter = intra)."""
    intra: Link
    inter: Link | None = None
    local_size: int | None = None

    def link(self, crosses_nodes: bool) -> Link:
        return self.inter if crosses_nodes and self.inter is not None else self.intra


def _ring(n: int, nbytes: float, link: Link) -> float:
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * link.alpha + 2 * (n - 1) / n * nbytes * link.beta + (n - 1) / n * nbytes * link.gamma


def _ring_half(n: int, nbytes: float, link: Link, reduce: bool) -> float:
    """One reduce-scatter (reduce=True) or all-gather of nbytes over n ranks."""
    if n <= 1:
        return 0.0
    per_step = link.alpha + nbytes / n * (link.beta + (link.gamma if reduce else 0.0))
    return (n - 1) * per_step


def _two_levels(n: int, net: Network) -> bool:
    return net.inter is not None and net.local_size is not None and n > net.local_size


def predict(algo: str, nbytes: float, n: int, net: Network | Link,
            grid: tuple[int, int] | None = None) -> float:
    """Predicted seconds for one all-reduce of ``nbytes`` over ``n`` ranks.

    ``net``: a Link (every pair alike) or a two-level Network. ``grid`` (rows, cols)
    for "torus"; rows of a two-level network should be nodes (cols = local_size).
    "native" is predicted as the ring (gloo and NCCL use rings for large messages).
    """
    if algo not in ALGORITHMS:
        raise ValueError(f"algo must be one of {ALGORITHMS}, got {algo!r}")
    if n < 1 or nbytes < 0:
        raise ValueError(f"need n >= 1 and nbytes >= 0, got n={n}, nbytes={nbytes}")
    net = net if isinstance(net, Network) else Network(net)
    if n == 1:
        return 0.0
    two = _two_levels(n, net)
    slow = net.link(two)  # a flat algorithm's steps are paced by the slowest link they use
    if algo in ("ring", "native"):
        return _ring(n, nbytes, slow)
    if algo == "naive":
        if two:
            local_peers, remote_peers = net.local_size - 1, n - net.local_size
            one_way = (local_peers * (net.intra.alpha + nbytes * net.intra.beta)
                       + remote_peers * (net.inter.alpha + nbytes * net.inter.beta))
        else:
            one_way = (n - 1) * (slow.alpha + nbytes * slow.beta)
        return 2 * one_way + (n - 1) * nbytes * net.intra.gamma
    if algo in ("halving_doubling", "tree"):
        steps = math.ceil(math.log2(n))
        if algo == "tree":
            return 2 * steps * (slow.alpha + nbytes * slow.beta) + steps * nbytes * slow.gamma
        return (2 * steps * slow.alpha + 2 * (n - 1) / n * nbytes * slow.beta
                + (n - 1) / n * nbytes * slow.gamma)
    rows, cols = grid if grid is not None else _square(n)
    if rows * cols != n:
        raise ValueError(f"grid {rows}x{cols} does not hold {n} ranks")
    # Row phases stay inside a node when cols divides the node; column phases cross nodes.
    row_link = net.link(two and net.local_size % cols != 0)
    col_link = net.link(two)
    return (_ring_half(cols, nbytes, row_link, True) + _ring(rows, nbytes / cols, col_link)
            + _ring_half(cols, nbytes, row_link, False))


def _square(n: int) -> tuple[int, int]:
    rows = max(r for r in range(1, int(n ** 0.5) + 1) if n % r == 0)
    return rows, n // rows


def fit_link(sizes: list[float], seconds: list[float], gamma: float = 0.0) -> Link:
    """alpha and beta from one-way point-to-point times t = alpha + K beta.

    beta is the least-squares slope over all sizes (the large messages dominate it,
    as they should: it is a bandwidth); alpha is the smallest message's time less
    its own K beta. A plain least-squares intercept would be swamped by the noise
    of the large transfers and often come out negative. Needs at least two distinct
    sizes; negative values (noise) are clamped to zero.
    """
    if len(sizes) != len(seconds) or len(set(sizes)) < 2:
        raise ValueError("fit_link needs times for at least two distinct message sizes")
    n = len(sizes)
    mean_k, mean_t = sum(sizes) / n, sum(seconds) / n
    var = sum((k - mean_k) ** 2 for k in sizes)
    beta = max(0.0, sum((k - mean_k) * (t - mean_t) for k, t in zip(sizes, seconds)) / var)
    k_min, t_min = min(zip(sizes, seconds))
    return Link(max(0.0, t_min - k_min * beta), beta, gamma)


def simulate(ns: list[int], nbytes: float, net: Network | Link,
             algos: tuple[str, ...] = ("naive", "ring", "halving_doubling", "torus")) -> dict:
    """Predicted seconds for each algorithm at each world size (torus on the most square grid)."""
    return {algo: [predict(algo, nbytes, n, net) for n in ns] for algo in algos}
