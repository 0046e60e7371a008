"""The captioned grid an evaluation leaves in ``out_dir/samples/policy_v<k>.png`` (docs/operations.md,
"Reading a run"): one cell per held-out prompt, its image above its caption (the prompt, wrapped, and the
sample's reward); a video model's cell is a strip of evenly spaced frames. Drawn with PIL (a dependency).
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import torch

from digenrl.runtime.run_folder.run_files import ensure_dir, open_new, publish, temporary_name

SAMPLES_DIR = "samples"
#: longest side of one picture in the grid (larger samples are scaled down, smaller ones up)
CELL_PIXELS = 192
COLUMNS = 4  # cells per row of an image grid (a video grid has one sample per row)
CAPTION_LINES = 3
_LINE_HEIGHT = 12
_PAD = 6


def grid_path(out_dir: str | Path, policy_version: int) -> Path:
    """The grid of the evaluation of policy version ``policy_version`` (the policy after that many updates):
    named by the policy it shows, not the iteration that evaluated it (the run's last grid, drawn after
    update N, is ``policy_v<N>.png``)."""
    return Path(out_dir) / SAMPLES_DIR / f"policy_v{policy_version}.png"


def write_sample_grid(
    path: str | Path, images: torch.Tensor, prompts: list[str], rewards: list[float], title: str = ""
) -> Path:
    """Write the grid of ``images`` (uint8 ``[N, 3, H, W]``, or ``[N, F, 3, H, W]``: frames of videos)
    captioned by ``prompts`` and ``rewards`` to ``path`` (atomically); returns it."""
    from PIL import Image, ImageDraw

    if not (len(images) == len(prompts) == len(rewards)) or not len(images):
        raise ValueError(
            f"a sample grid needs one prompt and one reward per image, got {len(images)} image(s), "
            f"{len(prompts)} prompt(s), {len(rewards)} reward(s)"
        )
    strips = [_strip(sample) for sample in images]
    cell_w = max(s.width for s in strips)
    cell_h = max(s.height for s in strips)
    columns = 1 if images.ndim == 5 else min(COLUMNS, len(strips))
    rows = math.ceil(len(strips) / columns)
    caption_h = (CAPTION_LINES + 1) * _LINE_HEIGHT
    title_h = _LINE_HEIGHT + _PAD if title else 0
    canvas = Image.new(
        "RGB",
        (columns * (cell_w + _PAD) + _PAD, title_h + rows * (cell_h + caption_h + _PAD) + _PAD),
        "white",
    )
    draw = ImageDraw.Draw(canvas)
    if title:
        draw.text((_PAD, _PAD // 2), title, fill="black")
    chars = max(8, cell_w // 6)  # PIL's default bitmap font is ~6 px wide
    for index, (strip, prompt, reward) in enumerate(zip(strips, prompts, rewards, strict=True)):
        x = _PAD + (index % columns) * (cell_w + _PAD)
        y = title_h + _PAD + (index // columns) * (cell_h + caption_h + _PAD)
        canvas.paste(strip, (x, y))
        lines = textwrap.wrap(prompt, chars)[:CAPTION_LINES] or [""]
        lines.append(f"reward {reward:+.4f}" if math.isfinite(reward) else "reward non-finite")
        for n, line in enumerate(lines):
            draw.text((x, y + cell_h + 2 + n * _LINE_HEIGHT), line, fill="black")
    path = Path(path)
    ensure_dir(path.parent)
    tmp = temporary_name(path)
    with open_new(tmp) as stream:
        canvas.save(stream, format="PNG")
    publish(tmp, path)
    return path


def _strip(sample: torch.Tensor):  # -> PIL.Image.Image
    """One sample as a picture: an image, or a video's frames side by side, scaled to :data:`CELL_PIXELS`."""
    from PIL import Image

    frames = sample.unsqueeze(0) if sample.ndim == 3 else sample
    pictures = [Image.fromarray(f.permute(1, 2, 0).contiguous().numpy(), "RGB") for f in frames]
    h, w = pictures[0].height, pictures[0].width
    scale = CELL_PIXELS / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    resample = Image.Resampling.NEAREST if scale >= 1 else Image.Resampling.BICUBIC
    pictures = [p.resize(size, resample) for p in pictures]
    strip = Image.new("RGB", (size[0] * len(pictures), size[1]))
    for n, picture in enumerate(pictures):
        strip.paste(picture, (n * size[0], 0))
    return strip
