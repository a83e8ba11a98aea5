"""torch.compile on virtual GPUs (docs/compile.md): Dynamo, AOTAutograd and Inductor compile as
on a GPU machine (torch_compile.py), and the Triton kernels Inductor generates are launched as
fused kernels the simulator prices (compiled_kernels.py)."""
