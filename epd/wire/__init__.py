"""Wire encoding of domain values: tensors to and from `epd.v1` messages."""
