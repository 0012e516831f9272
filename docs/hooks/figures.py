"""MkDocs hook: the site shows the figures that live in `experiments/` (the controller zoo's
curves, the rendered GIFs) under `figures/`, without a second copy in `docs/`."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
FIGURES = ["zoo_curves.png", "gifs/cartpole.gif", "gifs/breakout_minatar.gif"]


def on_files(files, config):
    for name in FIGURES:
        files.append(File.generated(config, f"figures/{Path(name).name}", abs_src_path=str(EXPERIMENTS / name)))
    return files
