"""Keeping explanations from drifting: map fingerprints and provenance in every row (``fingerprint``,
``provenance``), and ``gradcam diff`` (``manifests``: reading the two sides, ``pairing``, ``measures``,
``compare``: the verdict, ``table`` and ``page``: the text and HTML reports)."""
