"""MkDocs hook: the site shows the figures that live in `experiments/` (the controller zoo's
curves, one figure per family, Craftax-Classic's curves and the rendered GIFs) under `figures/`,
without a second copy in `docs/`."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
# `python experiments/zoo.py figure` writes one zoo_curves_<family>.png per family.
ZOO_CURVES = [p.name for p in sorted(EXPERIMENTS.glob("zoo_curves_*.png"))]
# `python experiments/craftax_eval.py ... --figure` writes craftax_classic_curves.png.
FIGURES = ZOO_CURVES + ["craftax_classic_curves.png", "gifs/cartpole.gif", "gifs/breakout_minatar.gif"]


def on_files(files, config):
    for name in FIGURES:
        files.append(File.generated(config, f"figures/{Path(name).name}", abs_src_path=str(EXPERIMENTS / name)))
    return files
