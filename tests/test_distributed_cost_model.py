"""Cost-model formulas against hand-computed values."""

import pytest

from hasten.distributed.cost_model import Link, Network, fit_link, predict, simulate

A, B, G = 1e-4, 1e-9, 1e-10  # 100 us, 1 GB/s, 10 GB/s summing
LINK = Link(A, B, G)
K = 1e6


def test_one_level_formulas_by_hand():
    # naive, N=4: 2*3*(1e-4 + 1e-3) + 3*1e6*1e-10 = 6.6e-3 + 3e-4
    assert predict("naive", K, 4, LINK) == pytest.approx(6.9e-3)
    # ring, N=4: 6*1e-4 + 1.5*1e-3 + 0.75*1e-4
    assert predict("ring", K, 4, LINK) == pytest.approx(6e-4 + 1.5e-3 + 7.5e-5)
    assert predict("native", K, 4, LINK) == predict("ring", K, 4, LINK)
    # halving-doubling, N=8: 6*1e-4 + 1.75e-3 + 0.875e-4
    assert predict("halving_doubling", K, 8, LINK) == pytest.approx(6e-4 + 1.75e-3 + 8.75e-5)
    # binomial tree, N=8: 6*(1e-4+1e-3) + 3*1e-4
    assert predict("tree", K, 8, LINK) == pytest.approx(6.9e-3)
    # torus 2x4: row RS 3*(1e-4 + 2.5e5*1.1e-9) + col ring of 2.5e5 over 2 + row AG 3*(1e-4 + 2.5e-4)
    rs = 3 * (1e-4 + 2.5e5 * (B + G))
    col = 2 * 1e-4 + 2.5e5 * B + 0.5 * 2.5e5 * G
    ag = 3 * (1e-4 + 2.5e5 * B)
    assert predict("torus", K, 8, LINK, grid=(2, 4)) == pytest.approx(rs + col + ag)
    assert predict("ring", K, 1, LINK) == 0.0


def test_ring_bandwidth_term_is_flat_and_naive_linear_in_n():
    bw_only = Link(0.0, B)
    ring = [predict("ring", K, n, bw_only) for n in (2, 4, 8)]
    naive = [predict("naive", K, n, bw_only) for n in (2, 4, 8)]
    assert ring == pytest.approx([1e-3, 1.5e-3, 1.75e-3])
    assert naive == pytest.approx([2e-3, 6e-3, 14e-3])


def test_two_levels_hierarchical_beats_flat_ring():
    fast, slow = Link(0.0, 1e-9), Link(0.0, 4e-9)
    net = Network(fast, slow, local_size=4)
    # flat ring on 8 ranks is paced by the slow link: 1.75 * K * 4e-9
    assert predict("ring", K, 8, net) == pytest.approx(7e-3)
    # hierarchical 2 nodes x 4: RS+AG inside nodes 2 * 0.75 K * 1e-9, K/4 ring across: 2*(1/2)*(K/4)*4e-9
    assert predict("torus", K, 8, net, grid=(2, 4)) == pytest.approx(1.5e-3 + 1e-3)
    # naive from rank 0: 3 fast + 4 slow peers, both ways
    assert predict("naive", K, 8, net) == pytest.approx(2 * (3e-3 + 16e-3))
    # within one node the slow link is never used
    assert predict("ring", K, 4, net) == pytest.approx(1.5e-3)


def test_fit_link_recovers_alpha_beta():
    sizes = [1e3, 1e5, 1e6, 1e7]
    link = fit_link(sizes, [5e-5 + k * 8e-9 for k in sizes])
    assert link.alpha == pytest.approx(5e-5) and link.beta == pytest.approx(8e-9)
    assert link.gbit_per_s == pytest.approx(1.0)
    with pytest.raises(ValueError, match="two distinct"):
        fit_link([1e3, 1e3], [1.0, 2.0])


def test_simulator_at_scale_torus_latency_term_grows_as_sqrt_n():
    latency_only = Link(1e-5, 0.0)
    sim = simulate([1024, 4096], 1e8, latency_only, algos=("ring", "torus"))
    assert sim["ring"] == pytest.approx([2 * 1023 * 1e-5, 2 * 4095 * 1e-5])
    # 32x32 and 64x64 grids: 4(sqrt N - 1) steps
    assert sim["torus"] == pytest.approx([4 * 31 * 1e-5, 4 * 63 * 1e-5])


def test_bad_input():
    with pytest.raises(ValueError, match="algo must be one of"):
        predict("butterfly", K, 4, LINK)
    with pytest.raises(ValueError, match="does not hold 8 ranks"):
        predict("torus", K, 8, LINK, grid=(3, 3))
