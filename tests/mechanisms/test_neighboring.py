"""Neighbouring relations (pldjax.mechanisms.neighboring), and zero-out (REPLACE_SPECIAL) through every noise
and sampling scheme: the pair where it has a meaning (dp-accounting's), a clear refusal elsewhere."""

import dp_accounting as dpa
import pytest
from dp_accounting.pld import privacy_loss_distribution as dpa_pld

import pldjax as pj
from pldjax.mechanisms.neighboring import Neighboring


def test_members_are_their_strings():
    assert Neighboring.ADD_REMOVE == "add_remove" and Neighboring.REPLACE_ONE == "replace_one"
    assert Neighboring.REPLACE_SPECIAL == "replace_special"
    assert Neighboring.parse("replace_one") is Neighboring.REPLACE_ONE
    assert Neighboring.parse(Neighboring.ADD_REMOVE) is Neighboring.ADD_REMOVE


@pytest.mark.parametrize("bad", ["swap", "ADD_REMOVE", None, 1, ["add_remove"]])
def test_anything_else_is_refused_naming_the_argument(bad):
    with pytest.raises(ValueError, match=r"neighboring must be one of \('add_remove', 'replace_one', "
                                         r"'replace_special'\)"):
        Neighboring.parse(bad)
    with pytest.raises(ValueError, match="adjacency"):
        Neighboring.parse(bad, "adjacency")


def test_zero_out_is_add_remove_for_additive_noise_as_in_dp_accounting():
    """dp-accounting builds REPLACE_SPECIAL's PLD of (Poisson-subsampled) additive noise as
    add/remove's; so does pldjax, on every noise and scheme with a meaning for it."""
    rs = "replace_special"
    cases = [
        (pj.noise.Gaussian(1.3), None),
        (pj.noise.Laplace(2.0), pj.sampling.Poisson(0.05)),
        (pj.noise.Gaussian(1.0), pj.sampling.Poisson(0.01)),
    ]
    for noise, sampling in cases:
        zero_out = pj.privacy_loss(noise, sampling, rs)
        add_remove = pj.privacy_loss(noise, sampling, "add_remove")
        assert float(zero_out.epsilon(1e-6)) == float(add_remove.epsilon(1e-6))
        assert pj.Event(noise, sampling, rs).neighboring is Neighboring.REPLACE_SPECIAL
    theirs = dpa_pld.from_gaussian_mechanism(
        1.0, sampling_prob=0.01,
        neighboring_relation=dpa.NeighboringRelation.REPLACE_SPECIAL).get_epsilon_for_delta(1e-6)
    ours = float(pj.gaussian(1.0, sampling_prob=0.01, neighboring=rs).epsilon(1e-6))
    assert ours == pytest.approx(theirs, abs=1e-3)


def test_zero_out_is_refused_where_it_has_no_meaning():
    with pytest.raises(ValueError, match="replace_one"):
        pj.gaussian(1.0, sampling_prob=0.1, neighboring="replace_special", sampling="fixed_batch")
    with pytest.raises(ValueError, match="add_remove"):
        pj.privacy_loss(pj.noise.RandomizedResponse(1.0), None, "replace_special")


def test_every_noise_pairs_zero_out_as_add_remove():
    """Cheap (no discretization): the pair each noise and the mixture scheme return."""
    rs, ar = Neighboring.REPLACE_SPECIAL, Neighboring.ADD_REMOVE
    for noise in (pj.noise.Gaussian(1.3, 2.0), pj.noise.GDP(0.5), pj.noise.Laplace(2.0),
                  pj.noise.DiscreteLaplace(2.0, 3), pj.noise.DiscreteGaussian(3.0, 2)):
        (mech_rs, params_rs), (mech_ar, params_ar) = noise.pair(rs, True), noise.pair(ar, True)
        assert mech_rs is mech_ar
        assert [float(p) for p in params_rs] == [float(p) for p in params_ar]
    mixture = pj.sampling.Mixture([0.0, 1.0, 2.0], [0.9, 0.08, 0.02])
    noise = pj.noise.Gaussian(1.0)
    zero_out, add_remove = mixture.directions(noise, rs, True), mixture.directions(noise, ar, True)
    assert zero_out.mechanism is add_remove.mechanism and zero_out.both
    assert [float(p) for p in zero_out.params] == [float(p) for p in add_remove.params]
