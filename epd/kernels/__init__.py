"""Native CPU kernels: C++ sources built on a worker's first start and cached per machine (`native.py`)."""

# --kernels: ours where they build (auto), ours or refuse to start (native), torch's operators (torch).
# Here, free of torch, so the command-line parsers can offer them without importing it.
MODES = ("auto", "native", "torch")
