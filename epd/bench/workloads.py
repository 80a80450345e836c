"""Deterministic benchmark requests: text prompts and synthetic images, the same for the same seed.

Every request is named by a key `"{seed}/{stream}/{index}"` and everything in it is drawn from a
`random.Random` seeded by that key, so the HTTP load and the transformers baseline see the same
requests, and a warm-up or background stream never repeats a measured request's images (an
embedding cache would otherwise hit and flatter the numbers). Only `repeat` shares images on
purpose: the requests of one stream draw from that stream's small pool, and each request knows
whether it is its image's first use in the stream (a cache miss) or a reuse (a hit).
"""

from __future__ import annotations

import base64
import io
import random
from dataclasses import dataclass
from functools import lru_cache

from PIL import Image, ImageDraw, ImageOps

WORKLOADS = ("text", "image-1", "image-4", "repeat")
IMAGE_1_SIZE = (448, 448)
# Mixed sizes and aspect ratios, so the encoder batches images of different token counts.
IMAGE_4_SIZES = ((448, 448), (320, 240), (224, 224), (640, 480))
REPEAT_SIZE = (448, 448)

_OPENERS = ("Describe", "Summarise", "Explain", "List what you notice about", "Write a short note on",
            "Compare", "Tell a story about", "Give three facts about")
_WORDS = ("river", "mountain", "lantern", "copper", "harbor", "violet", "engine", "garden", "meadow", "signal",
          "orbit", "marble", "thunder", "willow", "circuit", "canyon", "ember", "glacier", "falcon", "prism",
          "velvet", "compass", "desert", "island", "quartz", "saddle", "timber", "beacon", "cobalt", "fern",
          "harvest", "kettle", "lighthouse", "mosaic", "nebula", "oasis", "pepper", "ribbon", "summit", "tundra",
          "umbrella", "vessel", "whistle", "yarn", "zephyr", "anchor", "bridge", "candle", "dune", "echo",
          "feather", "granite", "horizon", "ivory", "jungle", "kite", "lagoon", "mirror", "needle", "opal")


@dataclass(frozen=True)
class WorkloadSpec:
    """What each request of a workload looks like."""

    name: str
    input_len: int = 16  # approximate words of text per request
    pool_size: int = 4  # `repeat` only: how many distinct images the requests share

    def __post_init__(self) -> None:
        if self.name not in WORKLOADS:
            raise ValueError(f"unknown workload {self.name!r}; choose one of {', '.join(WORKLOADS)}")
        if self.input_len < 1:
            raise ValueError(f"--input-len must be >= 1, got {self.input_len}")
        if self.pool_size < 1:
            raise ValueError(f"--pool-size must be >= 1, got {self.pool_size}")


@dataclass(frozen=True)
class ImageSpec:
    """One synthetic image, by key and size; pixels and PNG are made (and cached) on demand."""

    key: str
    width: int
    height: int

    def image(self) -> Image.Image:
        return _synthetic_image(self.key, self.width, self.height)

    def data_url(self) -> str:
        return _data_url(self.key, self.width, self.height)


@dataclass(frozen=True)
class BenchRequest:
    index: int
    text: str
    images: tuple[ImageSpec, ...]
    reuse: bool | None = None  # `repeat` only: an earlier request of the stream sent the same image

    def openai_messages(self) -> list[dict]:
        """OpenAI chat messages: image parts (data URLs) first, then the text."""
        parts = [{"type": "image_url", "image_url": {"url": spec.data_url()}} for spec in self.images]
        return [{"role": "user", "content": [*parts, {"type": "text", "text": self.text}]}]

    def hf_messages(self) -> list[dict]:
        """The same conversation for a transformers processor's chat template (PIL images)."""
        parts = [{"type": "image", "image": spec.image()} for spec in self.images]
        return [{"role": "user", "content": [*parts, {"type": "text", "text": self.text}]}]


def make_requests(spec: WorkloadSpec, count: int, *, seed: int = 0, stream: str = "measured",
                  start: int = 0) -> list[BenchRequest]:
    requests = [make_request(spec, index, seed=seed, stream=stream) for index in range(start, start + count)]
    if spec.name != "repeat":
        return requests
    seen: set[str] = set()
    marked = []
    for request in requests:
        key = request.images[0].key
        marked.append(BenchRequest(request.index, request.text, request.images, reuse=key in seen))
        seen.add(key)
    return marked


def make_request(spec: WorkloadSpec, index: int, *, seed: int = 0, stream: str = "measured") -> BenchRequest:
    key = f"{seed}/{stream}/{index}"
    text = prompt_text(key, spec.input_len)
    if spec.name == "text":
        images: tuple[ImageSpec, ...] = ()
    elif spec.name == "image-1":
        images = (ImageSpec(f"{key}/0", *IMAGE_1_SIZE),)
    elif spec.name == "image-4":
        images = tuple(ImageSpec(f"{key}/{slot}", w, h) for slot, (w, h) in enumerate(IMAGE_4_SIZES))
    else:  # repeat: the pool's key leaves out the index, so the stream's requests share it
        slot = random.Random(key).randrange(spec.pool_size)
        images = (ImageSpec(f"{seed}/{stream}/pool/{slot}", *REPEAT_SIZE),)
    return BenchRequest(index, text, images)


def prompt_text(key: str, words: int) -> str:
    """About `words` words (the opener counts as one or more), varied per key."""
    rng = random.Random(f"{key}/text")
    opener = rng.choice(_OPENERS)
    body = [rng.choice(_WORDS) for _ in range(max(1, words - len(opener.split())))]
    return f"{opener} {' '.join(body)}."


@lru_cache(maxsize=64)  # bounded: a background loop makes new images forever
def _synthetic_image(key: str, width: int, height: int) -> Image.Image:
    """A gradient in two random colours under random rectangles, ellipses and lines.

    Structure matters: a flat colour compresses to nothing and patch embeddings of identical
    patches are cheap to cache or batch in ways real images are not.
    """
    rng = random.Random(f"{key}/pixels")
    colour = lambda: tuple(rng.randrange(256) for _ in range(3))
    gradient = Image.linear_gradient("L").rotate(rng.uniform(0, 360)).resize((width, height))
    image = ImageOps.colorize(gradient, black=colour(), white=colour())
    draw = ImageDraw.Draw(image)
    for _ in range(rng.randrange(8, 17)):
        x0, y0 = rng.randrange(width), rng.randrange(height)
        x1, y1 = min(width, x0 + rng.randrange(8, width // 2 + 9)), min(height, y0 + rng.randrange(8, height // 2 + 9))
        shape = rng.randrange(3)
        if shape == 0:
            draw.rectangle((x0, y0, x1, y1), fill=colour())
        elif shape == 1:
            draw.ellipse((x0, y0, x1, y1), fill=colour(), outline=colour(), width=2)
        else:
            draw.line((x0, y0, x1, y1), fill=colour(), width=rng.randrange(1, 6))
    return image


@lru_cache(maxsize=64)
def _data_url(key: str, width: int, height: int) -> str:
    out = io.BytesIO()
    _synthetic_image(key, width, height).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
