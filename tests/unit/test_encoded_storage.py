"""An image's cached embedding owns its storage: a slice of the batch output would keep the whole
batch alive while the cache charges the image only its own bytes."""

import torch

from epd.engine.encode import EncodedImage, owned


def test_a_slice_of_a_batch_is_copied_into_storage_of_its_own():
    batch = torch.arange(4 * 1000 * 8, dtype=torch.float32).reshape(4000, 8)  # [images * tokens, hidden]
    image = batch[1000:2000]  # what splitting the batch per image gives: a contiguous view
    assert image.is_contiguous() and image.untyped_storage().nbytes() == batch.numel() * 4
    kept = owned(image)
    assert kept.untyped_storage().nbytes() == image.numel() * 4 == EncodedImage({"pooler_output": kept},
                                                                               (1, 2, 2)).nbytes
    assert torch.equal(kept, image)


def test_a_tensor_that_owns_its_storage_is_not_copied():
    t = torch.ones(10, 4)
    assert owned(t) is t
    transposed = torch.ones(4, 10).t()  # whole storage, but not contiguous
    assert owned(transposed).is_contiguous()
