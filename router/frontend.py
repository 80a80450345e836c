"""What both front ends share: from a parsed chat request to a Job the orchestrator can run.

Images are fetched / decoded here under limits (bytes, pixels, SSRF guard) so that a bad image is a
400 from the router, never a failure deep in an encoder; the prompt is rendered with the
checkpoint's chat template and one placeholder per image.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from dataclasses import dataclass, field

import httpx

from epd.chat import render_prompt
from epd.digest import FileDigests
from router.chat_request import ChatRequest
from router.errors import RequestError
from router.image_source import ImageLimits, decode_data_url, decode_image, load_image_bytes
from router.limits import fit_max_tokens
from router.offload import Offload
from router.orchestrator import ImagePart, Job


@dataclass(frozen=True)
class Frontend:
    tokenizer: object
    http: httpx.AsyncClient  # follow_redirects=False: image_source checks every hop itself
    image_limits: ImageLimits
    allowed_hosts: frozenset[str]
    max_prompt_tokens: int
    request_timeout_s: float
    context_length: int | None = None  # the model's, from its config; None: not checked here
    # Base64, Pillow, the chat template and the tokenizer run here, never on the event loop.
    offload: Offload = field(default_factory=Offload)
    # Files already decoded and checked under image_limits (fixed for the router's life): a repeat
    # skips Pillow (an image reused from the encoder's cache costs its TTFT no decode at all).
    seen_files: FileDigests = field(default_factory=FileDigests)

    async def prepare(self, request: ChatRequest) -> Job:
        params = request.image_params or tuple(f"image[{i}]" for i in range(len(request.image_urls)))
        loads = (self._image(url, param) for url, param in zip(request.image_urls, params, strict=True))
        images = await asyncio.gather(*loads)
        prompt_ids = await self.offload.run(self._render, request.messages)
        if len(prompt_ids) > self.max_prompt_tokens:
            raise RequestError(f"the prompt has {len(prompt_ids)} tokens before images; the limit is "
                               f"{self.max_prompt_tokens}", param="messages", code="context_length_exceeded")
        max_tokens = fit_max_tokens(len(prompt_ids), request.sampling.max_tokens, request.max_tokens_given,
                                    self.context_length)
        sampling = dataclasses.replace(request.sampling, max_tokens=max_tokens)
        return Job(request_id=f"chatcmpl-{uuid.uuid4().hex}", prompt_ids=prompt_ids, images=list(images),
                   sampling=sampling, timeout_s=self.request_timeout_s)

    def _pixel_digest(self, data: bytes) -> str:
        """The file's pixel digest, decoding it (under the limits: RequestError) unless seen before."""
        digest, _ = self.seen_files.pixel_digest(data, lambda d: decode_image(d, self.image_limits))
        return digest

    def _render(self, messages: list[dict]) -> list[int]:
        try:
            return render_prompt(self.tokenizer, messages)
        except Exception as exc:  # jinja errors from an unusual conversation shape
            raise RequestError(f"the chat template cannot render these messages: {str(exc)[:200]}",
                               param="messages") from None

    async def _image(self, url: str, param: str) -> ImagePart:
        try:
            if url[:5].lower() == "data:":
                data = await self.offload.run(decode_data_url, url, self.image_limits)
            else:
                data = await load_image_bytes(url, client=self.http, limits=self.image_limits,
                                              allowed_hosts=self.allowed_hosts)
            return ImagePart(data=data, pixel_digest=await self.offload.run(self._pixel_digest, data))
        except RequestError as exc:
            if exc.param is None:  # image_source knows the URL, not where the client put it
                exc.param = param
            raise
