"""Native CPU kernels: C++ sources built on a worker's first start and cached per machine (`native.py`)."""

# --kernels: ours where they build (auto), ours or refuse to start (native), torch's operators (torch).
# Here, free of torch, so the command-line parsers can offer them without importing it.
MODES = ("auto", "native", "torch")

# The products' kernels (moe_decode, linear_decode) multiply in vectors of 8 (AVX2, NEON) or 16
# (AVX-512) floats and have no remainder loop: the widths they take are multiples of this.
WIDTH_MULTIPLE = 16
