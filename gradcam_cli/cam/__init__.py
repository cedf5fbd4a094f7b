"""Explaining: the hook engine, the CAM methods, maps, layer handling and the :class:`Explainer`."""
