"""The virtual GPU as torch sees it: torch.cuda's answers (cuda_api.py), the native shim that
gives the CPU build of torch CUDA devices (shim/virtual_cuda.cpp; built by shim_build.py, called
through shim_calls.py), FakeTensorMode set up for virtual CUDA tensors (fake.py), ops that reach
the CUDA dispatch key (cuda_dispatch.py), CUDA graphs, random number generators, device
addresses and CUDA extensions built at run time."""
