"""Several GPUs and processes: the simulated NCCL process group (process_group.py) and the
argument checks NCCL makes before a collective (collective_checks.py), single-process multi-GPU
(data_parallel.py), and virtual tensors pickled between processes (pickling.py)."""
