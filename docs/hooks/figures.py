"""MkDocs hook: the site shows the figures that live in `experiments/` (the controller zoo's
curves, one figure per family, Craftax-Classic's curves and the rendered GIFs) under `figures/`,
without a second copy in `docs/`."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
# `python -m experiments.zoo figure` writes one zoo/zoo_curves_<family>.png per family.
ZOO_CURVES = [f"zoo/{p.name}" for p in sorted((EXPERIMENTS / "zoo").glob("zoo_curves_*.png"))]
# `python -m experiments.zoo craftax_eval ... --figure` draws craftax_classic_curves.png.
FIGURES = ZOO_CURVES + ["zoo/craftax_classic_curves.png", "gifs/cartpole.gif", "gifs/breakout_minatar.gif"]


def on_files(files, config):
    for name in FIGURES:
        files.append(File.generated(config, f"figures/{Path(name).name}", abs_src_path=str(EXPERIMENTS / name)))
    return files
