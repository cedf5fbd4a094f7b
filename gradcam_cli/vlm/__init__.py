"""Vision-language models: maps of a generated (or given) answer on the photo (docs/vlm.md).

``families`` (the supported families: default layer and geometry), ``geometry`` (putting a layer's image tokens back
on the photo), ``loading`` (``hf:DIR`` image-text-to-text models with their processor), ``answer`` (generation, the
answer's teacher-forced log-probability and its maps), ``outputs`` (overlays and rows), ``faithfulness``
(deletion and insertion curves of the answer).
"""
