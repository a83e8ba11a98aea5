"""Every aten op the program runs: the dispatch observer that runs it on virtual tensors and
reports it (observer.py), the op's signature as the simulator prices it (signature.py), and the
ops that need their own handling: higher-order ops (hops.py) and custom ops (custom_ops.py)."""
