"""Vision-language models: maps of a generated (or given) answer on the photo (docs/vlm.md).

``layouts`` (each family's token layout: default layer and geometry; which ``model_type`` has which is the
``vision-language`` model family's data), ``geometry`` (putting a layer's image tokens back on the photo),
``answer`` (generation, the answer's teacher-forced log-probability and its maps), ``faithfulness`` (deletion and
insertion curves of the answer). Such models are loaded by the family registry for the ``answer`` task; their runs
go through the session (:mod:`gradcam_cli.pipeline.answers`).
"""
