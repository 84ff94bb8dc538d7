"""Philox4x32-10 against Random123's known-answer vectors, and the stream layout."""

import numpy as np
import pytest

from dfmp2.rng import nki_random_words, normal, philox4x32, random_words, uniform

# Random123 kat_vectors, philox4x32 with 10 rounds: counter, key -> output
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter, key, expected", KNOWN_ANSWERS)
def test_known_answers(counter, key, expected):
    out = philox4x32(np.array([counter], dtype=np.uint64), key)
    assert out.dtype == np.uint32
    assert [int(x) for x in out[0]] == list(expected)


@pytest.mark.parametrize("counter, key, expected", KNOWN_ANSWERS)
def test_known_answers_with_torch(counter, key, expected):
    """The torch generator (16-bit halves instead of uint64 products) gives Random123's words."""
    import torch

    out = philox4x32(torch.tensor([counter], dtype=torch.int64), key)
    assert [int(x) for x in out[0]] == list(expected)


@pytest.mark.parametrize("seed, stream, start, count", [(0, 1, 0, 10), (2**40 + 7, 3, 13, 1001),
                                                        (2**64 - 1, 2**32 - 1, 2**33 + 1, 3000)])
def test_a_device_stream_is_the_host_stream(seed, stream, start, count):
    """device= (torch, here on the CPU): the same words bit for bit, the same variates to the
    last bit of fp64 (log, cos and sin are another library's)."""
    words = random_words(seed, stream, start, count, device="cpu")
    assert np.array_equal(words.numpy(), random_words(seed, stream, start, count).astype(np.int64))
    assert np.array_equal(uniform(seed, stream, start, count, device="cpu").numpy(),
                          uniform(seed, stream, start, count))
    host = normal(seed, stream, start, count)
    assert np.abs(normal(seed, stream, start, count, device="cpu").numpy() - host).max() <= 4e-16 * np.abs(host).max()


def test_vectorised_blocks_match_one_at_a_time():
    counters = np.array([[i, 7, 3, 0] for i in range(50)], dtype=np.uint64)
    together = philox4x32(counters, (11, 12))
    for i in range(50):
        assert np.array_equal(together[i], philox4x32(counters[i:i + 1], (11, 12))[0])


def test_any_range_of_a_stream_is_generated_independently():
    whole = random_words(42, 5, 0, 1000)
    assert np.array_equal(random_words(42, 5, 333, 101), whole[333:434])
    normals = normal(42, 5, 0, 1000)
    assert np.array_equal(normal(42, 5, 123, 77), normals[123:200])
    assert np.array_equal(normal(42, 5, 124, 1), normals[124:125])


def test_streams_seeds_and_blocks_differ():
    base = random_words(1, 1, 0, 64)
    assert not np.array_equal(base, random_words(2, 1, 0, 64))
    assert not np.array_equal(base, random_words(1, 2, 0, 64))
    big = random_words(1, 1, 4 * 2**32 - 8, 16)  # crosses the 2^32-block boundary (counter word 1)
    assert len(np.unique(big)) == 16


def test_variate_distributions():
    u = uniform(3, 1, 0, 200_000)
    assert 0 < u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
    z = normal(3, 2, 0, 200_000)
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    assert abs(np.mean(np.abs(z) < 1.96) - 0.95) < 0.005


@pytest.mark.parametrize("target, api, lnc", [("trn1", "0.2", 1), ("trn2", "0.3", 1), ("trn2", "0.6", 2),
                                              ("trn2", "0.7", 1), ("trn3", "0.6", 2), ("trn3", "0.7", 1)])
def test_the_nki_generators_words_are_the_hosts(monkeypatch, target, api, lnc):
    """rng/nki_philox.py on the emulator (every target and release, one or two physical cores a launch):
    the host's words bit for bit, for a seed above 2^32, the largest stream, a start inside a block,
    several launches, and blocks across 2^32 (the counter's second word); the launches are in the
    backend's cost ledger; a model-only repeat (host reference) gives the same words."""
    from dfmp2.kernels import get_backend

    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", str(lnc))
    for seed, stream, start, count in ((2 ** 40 + 99, 2 ** 32 - 1, 6, 3000), (5, 1, 4 * (2 ** 32 - 300), 2500)):
        backend = get_backend(target, simulate=True, nki_api=api, kernels=("philox_kernel",))
        assert backend.lnc == lnc
        words = nki_random_words(backend, seed, stream, start, count, max_blocks=2, max_tiles=2)
        assert words.dtype == np.uint32 and np.array_equal(words, random_words(seed, stream, start, count))
        assert len(backend.launcher.specializations["philox_kernel"]) == 1  # the counter is a run-time input
        launches = -(-((start + count - 1) // 4 - start // 4 + 1) // (128 * 2 * 2 * lnc))
        assert backend.ledger.calls["philox_kernel"] == launches
        assert backend.ledger.model_costs_by_step[target]["philox_kernel"]["seconds"] > 0  # (a MODEL)
    model = get_backend(target, simulate=True, model_only=True, nki_api=api, kernels=("philox_kernel",))
    for _ in range(2):  # the second launch of the same specialization: by host reference
        assert np.array_equal(nki_random_words(model, 3, 2, 0, 1024, max_blocks=2, max_tiles=2), random_words(3, 2, 0, 1024))


def test_the_nki_generator_refuses_what_its_counters_cannot_hold():
    """max_tiles and max_blocks within the kernel's limits (128 T F below 2^24 keeps iota's offsets
    exact), seeds below 2^64 and streams below 2^32: a clear error, not wrong words."""
    from dfmp2.kernels import get_backend

    backend = get_backend("trn2", simulate=True, nki_api="0.6")
    for kwargs, message in (({"max_tiles": 65}, "max_tiles must be between 1 and 64"),
                            ({"max_blocks": 0}, "max_blocks must be between 1 and 512"),
                            ({"seed": 2 ** 64}, "seed"), ({"stream": 2 ** 32}, "stream")):
        args = {"seed": 1, "stream": 0, **kwargs}
        limits = {k: v for k, v in kwargs.items() if k.startswith("max_")}
        with pytest.raises(ValueError, match=message):
            nki_random_words(backend, args["seed"], args["stream"], 0, 8, **limits)
