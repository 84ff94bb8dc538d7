"""The host's exact-product slicing (kernels/nki/ozaki.py) in cache-sized blocks on several threads: the
same bits as one pass over the whole array, and slices that add up to the fp64 operand."""

import numpy as np
import pytest
import torch

from dfmp2.kernels.nki import ozaki
from dfmp2.kernels.nki.tiles import SLICE_BITS


def one_pass_digits(a, exponent, count):
    """The digits of the scheme's definition, one slice at a time over the whole array."""
    rest = np.array(a, dtype=np.float64, copy=True)
    digits = np.empty((count,) + a.shape, dtype=np.int8)
    for s in range(count):
        grid = np.exp2(exponent - SLICE_BITS * (s + 1))
        digit = np.rint(rest / grid)
        digits[s] = digit
        rest -= digit * grid
    return digits


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def host_threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("shape, exponent_shape", [((700, 300), (700, 1)), ((40, 9000, 1), (40, 1, 1)),
                                                    ((5, 64, 300), (1, 1, 300)), ((3,), (3,))])
def test_blocked_digits_are_the_one_pass_digits(monkeypatch, host_threads, shape, exponent_shape):
    monkeypatch.setattr(ozaki, "BLOCK_ELEMENTS", 4096)  # many blocks even at test sizes
    rng = np.random.default_rng(sum(shape))
    a = rng.standard_normal(shape) * np.exp(rng.uniform(-12, 6, shape))
    axes = tuple(n for n, (x, e) in enumerate(zip(shape, exponent_shape)) if e == 1 and x > 1)
    exponent = ozaki.digit_exponent(np.abs(a).max(axis=axes, keepdims=True)) if axes else ozaki.digit_exponent(np.abs(a))
    digits = ozaki.split_digits(a, exponent, ozaki.X_DIGITS)
    assert np.array_equal(digits, one_pass_digits(a, exponent, ozaki.X_DIGITS))
    weights = np.exp2(exponent - SLICE_BITS * np.arange(1, ozaki.X_DIGITS + 1).reshape((-1,) + (1,) * a.ndim))
    value = (digits * weights).sum(axis=0)
    assert np.all(np.abs(value - a) <= np.exp2(exponent - SLICE_BITS * ozaki.X_DIGITS))  # 35 bits below the largest


def test_blocked_column_slices_add_up_to_the_operand(monkeypatch, host_threads):
    monkeypatch.setattr(ozaki, "BLOCK_ELEMENTS", 4096)
    rng = np.random.default_rng(7)
    a = rng.standard_normal((3, 500, 40)) * np.exp(rng.uniform(-20, 2, (3, 500, 40)))
    slices = ozaki.column_slices(a, ozaki.INPUT_SLICES)
    assert slices.dtype == np.float32
    exponent = np.ceil(np.log2(np.abs(a).max(axis=-2, keepdims=True)))
    assert np.all(np.abs(slices.astype(np.float64).sum(axis=0) - a) <= np.exp2(exponent - 7 * ozaki.INPUT_SLICES))
    monkeypatch.setattr(ozaki, "BLOCK_ELEMENTS", 1 << 30)  # one block: the same bits
    assert np.array_equal(ozaki.column_slices(a, ozaki.INPUT_SLICES), slices)
