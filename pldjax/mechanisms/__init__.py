"""Layer 3, the mechanisms: noise x sampling scheme x neighbouring relation -> event -> PLD.

A new noise distribution is a record in ``noise``; a new sampling scheme a
:class:`~pldjax.mechanisms.sampling.Sampling` subclass in ``sampling`` (its exact tails in a
kernel module of its own, as ``subsampling`` and ``truncated_poisson`` are). ``neighboring``
holds the relations, ``events`` the :class:`~pldjax.mechanisms.events.Event` record and
:func:`~pldjax.mechanisms.events.privacy_loss`, and ``named`` the named constructors
(``gaussian``, ``laplace``, ...). Mechanisms use only the kernels and the core.
"""
