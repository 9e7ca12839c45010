"""The shuffle buffer (hasten.echo.shuffle_buffer): every item once, bounded, reproducible."""

import pytest

from hasten.echo.shuffle_buffer import shuffle_buffer


@pytest.mark.parametrize("bad", [-1, 2.5, "8"])
def test_invalid_buffer_size(bad):
    with pytest.raises(ValueError, match="integer >= 0"):
        shuffle_buffer(range(3), bad)


def test_shuffle_buffer_is_a_permutation():
    out = list(shuffle_buffer(range(1000), 100, seed=1))
    assert sorted(out) == list(range(1000)) and out != list(range(1000))
    assert list(shuffle_buffer(range(10), 0)) == list(range(10))


def test_dynamic_buffer_size_is_a_permutation_that_follows_the_size():
    sizes = iter([0] * 200 + [100] * 600 + [10] * 10_000)
    out = list(shuffle_buffer(range(2000), lambda: next(sizes), seed=5))
    assert sorted(out) == list(range(2000))
    assert out[:200] == list(range(200))  # size 0: passed through in order
    # With 100 buffered items an item leaves on average ~100 places late; with 10, ~10.
    lag_big = sum(abs(out[i] - i) for i in range(500, 700)) / 200
    lag_small = sum(abs(out[i] - i) for i in range(1500, 1900)) / 400
    assert lag_big > 30 and lag_small < 15, (lag_big, lag_small)


def test_a_buffer_holds_size_items_before_its_first_output():
    pulled = []

    def source():
        for i in range(40):
            pulled.append(i)
            yield i

    pulled.clear()
    it = shuffle_buffer(source(), 8, seed=1)
    first = next(it)
    assert len(pulled) == 9 and first < 8  # the ninth arrival pushes out one of the first eight
    # A size-1 buffer (fixed or from a function) passes each item on before pulling the next.
    for size_arg in (1, lambda: 1, 0, lambda: 0):
        pulled.clear()
        it = shuffle_buffer(source(), size_arg, seed=1)
        assert [next(it) for _ in range(5)] == [0, 1, 2, 3, 4] and len(pulled) == 5


@pytest.mark.parametrize("size", [2, 3, 8, 50])
def test_a_growing_size_function_buffer_lets_one_item_out_per_two_taken_in(size):
    # While it fills, a dynamic buffer must not stall its consumer (every rise of AutoEcho's
    # e grows it): after m arrivals below its size it has given out m // 2 items; once full,
    # one per arrival; every item exactly once, shuffled.
    pulled = []

    def source():
        for i in range(200):
            pulled.append(i)
            yield i

    it = shuffle_buffer(source(), lambda: size, seed=4)
    out = []
    while len(out) < size:
        out.append(next(it))
        assert len(pulled) == 2 * len(out), (len(pulled), len(out))
    out += list(it)
    assert sorted(out) == list(range(200)) and out != list(range(200))


def test_shuffle_buffer_is_reproducible_and_its_default_seed_is_zero():
    for size in (8, lambda: 8):
        a = list(shuffle_buffer(range(100), size))
        assert a == list(shuffle_buffer(range(100), size)) == list(shuffle_buffer(range(100), size, seed=0))
        assert a != list(shuffle_buffer(range(100), size, seed=1))


def test_a_buffer_shrunk_to_one_item_can_no_longer_reorder():
    sizes = iter([6] * 20 + [1] * 1000)
    out = list(shuffle_buffer(range(60), lambda: next(sizes), seed=2))
    assert sorted(out) == list(range(60))
    # Item 20 arrives with size 1: the surplus (5 of the 6 held) goes out first, then one item is
    # held at a time, so everything from there on leaves in arrival order.
    tail = out[-39:]
    assert tail == sorted(tail), out
