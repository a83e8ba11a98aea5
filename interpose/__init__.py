"""Interposition: what runs inside the user's processes so that a CPU machine looks like the
simulated GPU cluster to torch. It reports what the program does to the simulator and answers
with simulated time; it never simulates anything itself.

  runtime.py     a rank process's state: its configuration, its virtual GPUs' memory, its identity
  client.py      its one connection to the simulator (phantora/protocol.py)
  launch/        how a process becomes a rank: the bootstrap on PYTHONPATH, the import hook that
                 installs everything at `import torch`, the fork server
  device/        the virtual GPU as torch sees it: torch.cuda, the native shim, FakeTensorMode,
                 the CUDA dispatch key, CUDA graphs, RNG, addresses, CUDA extensions
  ops/           every aten op the program runs: the dispatch observer that reports it, its
                 signature, higher-order and custom ops
  values/        what tensors without data read as: the value policy, data-dependent shapes,
                 MoE routing
  distributed/   the simulated NCCL process group and its argument checks, nn.DataParallel,
                 tensors pickled between processes
  compile/       torch.compile on virtual GPUs and the Triton kernels it launches
  host/          the host side's time: the virtual clock, measured Python time, Python-level
                 events, DataLoader workers
"""
