"""The cost of an answer's map (issue 32) against ``generate`` alone, on the tiny configurations of each family.

The tiny random models of tests/vlm_models.py (LLaVA-1.5 and NeXT, Qwen2-VL, Qwen2.5-VL, Idefics3; seeded), one
96x48 photo, one prompt, a greedy answer of ``--tokens`` new tokens. The baseline is the model's ``generate`` with
the explainer's settings (``Prompter.generate``, the answer task's score's); the cases, timed in alternation with it
(``bench_methods.paired``), medians over ``--repeats`` rounds: ``answer`` (generate, then the whole answer's
Grad-CAM map: one teacher-forced forward pass, one backward pass to the layer, placing on the photo), ``given``
(the map of a given answer: no generation), ``per-token`` (the generated answer's map and one per token). The
ratios of the tiny models say what the map adds to generation in passes, not a 7B model's times (docs/vlm.md).

Usage: ``python benchmarks/bench_vlm.py [--device cpu|cuda] [--repeats N] [--tokens N] [--families NAME,...]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import vlm_models  # noqa: E402
from bench_methods import paired  # noqa: E402
from vlm_models import answerer, load_vlm  # noqa: E402

from gradcam_cli.cam.prompted import explain_prompt  # noqa: E402

FAMILIES = vlm_models.BUILDERS
PROMPT = "what is the cat ?"


def photo() -> Image.Image:
    """The benchmark's photo: 96x48, two coloured halves."""
    image = Image.new("RGB", (96, 48), (220, 30, 30))
    image.paste((30, 30, 220), (48, 0, 96, 48))
    return image


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--families", default=",".join(FAMILIES))
    args = parser.parse_args()
    device = torch.device(args.device)
    image = photo()
    with tempfile.TemporaryDirectory() as folder:
        for name in args.families.split(","):
            path = FAMILIES[name](Path(folder) / name)
            explainer = answerer(load_vlm(f"hf:{path}", device), max_new_tokens=args.tokens)
            inputs = explainer.score.inputs(image, PROMPT)
            ids = explainer.score.generate(inputs)
            if not ids:
                print(f"{name}: the answer is empty (the model ended at once); nothing to time", flush=True)
                continue
            answer = explainer.score.tokenizer.decode(ids, skip_special_tokens=True)
            cases = {
                "answer": lambda e=explainer: explain_prompt(e, image, PROMPT),
                "given": lambda e=explainer, a=answer: explain_prompt(e, image, PROMPT, a),
                "per-token": lambda e=explainer: explain_prompt(e, image, PROMPT, per_token=True),
            }
            print(f"{name}, {len(ids)} answer tokens, {device}: time / generate alone", flush=True)
            for case, run in cases.items():
                took, base = paired(run, lambda e=explainer, x=inputs: e.generate(x), device, args.repeats)
                print(f"  {case:<10} {took / base:6.2f}x  ({took * 1000:.0f} ms vs {base * 1000:.0f} ms)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
