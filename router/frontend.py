"""What both front ends share: from a parsed chat request to a Job the orchestrator can run.

Images are fetched / decoded here under limits (bytes, pixels, SSRF guard) so that a bad image is a
400 from the router, never a failure deep in an encoder; the prompt is rendered with the
checkpoint's chat template and one placeholder per image.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

import httpx

from epd.chat import render_prompt
from epd.digest import pixel_digest
from router.chat_request import ChatRequest
from router.errors import RequestError
from router.image_source import ImageLimits, decode_image, load_image_bytes
from router.orchestrator import ImagePart, Job


@dataclass(frozen=True)
class Frontend:
    tokenizer: object
    http: httpx.AsyncClient  # follow_redirects=False: image_source checks every hop itself
    image_limits: ImageLimits
    allowed_hosts: frozenset[str]
    max_prompt_tokens: int
    request_timeout_s: float

    async def prepare(self, request: ChatRequest) -> Job:
        images = await asyncio.gather(*(self._image(url) for url in request.image_urls))
        try:
            prompt_ids = render_prompt(self.tokenizer, request.messages)
        except Exception as exc:  # jinja errors from an unusual conversation shape
            raise RequestError(f"the chat template cannot render these messages: {exc}", param="messages") from None
        if len(prompt_ids) > self.max_prompt_tokens:
            raise RequestError(f"the prompt has {len(prompt_ids)} tokens before images; the limit is "
                               f"{self.max_prompt_tokens}", param="messages")
        return Job(request_id=f"chatcmpl-{uuid.uuid4().hex}", prompt_ids=prompt_ids, images=list(images),
                   sampling=request.sampling, timeout_s=self.request_timeout_s)

    async def _image(self, url: str) -> ImagePart:
        data = await load_image_bytes(url, client=self.http, limits=self.image_limits,
                                      allowed_hosts=self.allowed_hosts)
        # Pillow decoding is CPU work: keep it off the event loop.
        image = await asyncio.to_thread(decode_image, data, self.image_limits)
        return ImagePart(data=data, pixel_digest=await asyncio.to_thread(pixel_digest, image))
