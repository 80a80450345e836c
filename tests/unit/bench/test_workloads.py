"""Benchmark requests are deterministic, distinct where caches must miss, shared where they must hit."""

import hashlib

import pytest

from epd.bench import cli
from epd.bench.workloads import IMAGE_4_SIZES, WORKLOADS, WorkloadSpec, make_request, make_requests


def pixels(spec) -> str:
    image = spec.image()
    return hashlib.sha256(f"{image.mode}{image.size}".encode() + image.tobytes()).hexdigest()


def test_the_cli_spells_the_workloads_as_the_generator_does():
    assert cli.WORKLOAD_NAMES == WORKLOADS


def test_same_seed_same_requests():
    spec = WorkloadSpec("image-4")
    a, b = make_requests(spec, 3, seed=5), make_requests(spec, 3, seed=5)
    assert [r.text for r in a] == [r.text for r in b]
    assert [pixels(s) for r in a for s in r.images] == [pixels(s) for r in b for s in r.images]
    assert a[0].openai_messages() == b[0].openai_messages()


def test_other_seed_other_requests():
    spec = WorkloadSpec("image-1")
    a, b = make_request(spec, 0, seed=1), make_request(spec, 0, seed=2)
    assert a.text != b.text
    assert pixels(a.images[0]) != pixels(b.images[0])


def test_image_1_gives_every_request_a_different_image():
    requests = make_requests(WorkloadSpec("image-1"), 24)
    assert all(r.images[0].image().size == (448, 448) for r in requests)
    assert len({pixels(r.images[0]) for r in requests}) == 24


def test_image_4_gives_four_distinct_images_of_mixed_sizes():
    requests = make_requests(WorkloadSpec("image-4"), 6)
    assert all(tuple(s.image().size for s in r.images) == IMAGE_4_SIZES for r in requests)
    assert len({pixels(s) for r in requests for s in r.images}) == 24


def test_warm_up_and_background_streams_never_repeat_a_measured_image():
    spec = WorkloadSpec("image-1")
    measured = {pixels(r.images[0]) for r in make_requests(spec, 8)}
    others = {pixels(r.images[0]) for stream in ("warmup-measured", "background-measured")
              for r in make_requests(spec, 8, stream=stream)}
    assert not measured & others


def test_repeat_draws_every_image_from_a_small_pool_of_its_stream():
    spec = WorkloadSpec("repeat", pool_size=3)
    measured = make_requests(spec, 30)
    used = {pixels(r.images[0]) for r in measured}
    assert len(used) == 3  # 30 draws from 3 images hit all of them
    warmup = {pixels(r.images[0]) for r in make_requests(spec, 10, stream="warmup-measured")}
    assert not warmup & used  # a warm-up never makes a measured first use a hit
    assert len({r.text for r in measured}) == 30  # the text still varies


def test_repeat_marks_first_uses_and_reuses_in_send_order():
    measured = make_requests(WorkloadSpec("repeat", pool_size=3), 30)
    first_uses = [r for r in measured if r.reuse is False]
    assert len(first_uses) == 3 and {r.images[0].key for r in first_uses} == {r.images[0].key for r in measured}
    seen = set()
    for r in measured:
        assert r.reuse == (r.images[0].key in seen)
        seen.add(r.images[0].key)
    assert all(r.reuse is None for r in make_requests(WorkloadSpec("image-1"), 3))


def test_images_have_structure_not_a_flat_colour():
    image = make_request(WorkloadSpec("image-1"), 0).images[0].image()
    assert len(image.getcolors(maxcolors=448 * 448)) > 100


def test_text_workload_has_no_images_and_about_input_len_words():
    requests = make_requests(WorkloadSpec("text", input_len=40), 10)
    assert all(not r.images for r in requests)
    assert all(38 <= len(r.text.split()) <= 42 for r in requests)
    assert len({r.text for r in requests}) == 10
    assert requests[0].openai_messages() == [{"role": "user", "content": [{"type": "text", "text": requests[0].text}]}]


def test_messages_put_images_first_as_png_data_urls():
    request = make_request(WorkloadSpec("image-4"), 3)
    parts = request.openai_messages()[0]["content"]
    assert [p["type"] for p in parts] == ["image_url"] * 4 + ["text"]
    assert all(p["image_url"]["url"].startswith("data:image/png;base64,") for p in parts[:4])
    hf_parts = request.hf_messages()[0]["content"]
    assert [p["type"] for p in hf_parts] == ["image"] * 4 + ["text"]
    assert hf_parts[1]["image"].size == IMAGE_4_SIZES[1]


@pytest.mark.parametrize(("kwargs", "match"), [({"name": "video"}, "unknown workload"),
                                                ({"name": "text", "input_len": 0}, "input-len"),
                                                ({"name": "repeat", "pool_size": 0}, "pool-size")])
def test_bad_specs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        WorkloadSpec(**kwargs)
