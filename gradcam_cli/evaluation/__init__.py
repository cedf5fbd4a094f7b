"""``gradcam eval``: faithfulness metrics, ground-truth boxes, the sanity check and the report."""
