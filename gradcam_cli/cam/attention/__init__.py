"""Attention-native explanations of vision transformers: which modules attend (:mod:`.discovery`), and the methods
built on their attention probabilities (:mod:`.rollout`, :mod:`.relevance`, :mod:`.last`, :mod:`.legrad`), pure
functions of the :class:`~.tokens.AttentionMaps` the engine captures (:mod:`gradcam_cli.cam.engine`)."""
