"""The PLD type: its directions."""

import numpy as np

import pldjax as pj
from pldjax.core.pld import PLD


def test_direction_helpers():
    gauss = pj.gaussian(1.0)  # symmetric: one direction stands for both
    assert gauss.forward is gauss and gauss.backward is gauss and gauss.directions() == (gauss,)
    assert gauss.map_directions(lambda d: d) is gauss

    sub = pj.gaussian(1.0, sampling_prob=0.1)  # remove and add directions differ
    forward, backward = sub.directions()
    assert forward.reverse is None and backward is sub.reverse and sub.backward is sub.reverse
    rebuilt = PLD.from_directions(forward, backward)
    np.testing.assert_array_equal(rebuilt.probs, sub.probs)
    assert rebuilt.reverse is backward
    swapped = sub.map_directions(lambda d: d.swap())  # one-direction swaps change nothing
    np.testing.assert_array_equal(swapped.reverse.probs, sub.reverse.probs)

    probs, inf_mass, offset, step = sub.stack_directions()
    n = max(forward.size, backward.size)
    assert probs.shape == (2, n) and inf_mass.shape == offset.shape == step.shape == (2,)
    np.testing.assert_array_equal(probs[1, :backward.size], backward.probs)
    assert np.all(np.asarray(probs[1, backward.size:]) == 0)
    batch = pj.gaussian(np.array([1.0, 2.0]))
    assert batch.stack_directions()[0].shape == (2, 1, batch.size)
