"""Native CPU kernels: C++ sources built on a worker's first start and cached per machine (`native.py`)."""
