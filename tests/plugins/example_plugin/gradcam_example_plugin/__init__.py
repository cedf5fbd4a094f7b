"""An example gradcam-cli plugin (docs/internals.md, "Writing a plugin"): the ``toy:`` model family
(:mod:`.family`), the ``toy-saliency`` method (:mod:`.method`) and a toy task (:mod:`.task`), each declared as an
entry point in this package's ``pyproject.toml``. Importing the package itself imports nothing of gradcam's."""
