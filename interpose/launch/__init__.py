"""How a process becomes a simulated rank: bootstrap/sitecustomize.py (first on the traced
command's PYTHONPATH) installs the import hook (hook.py), which loads the native shim before
torch and everything else right after `import torch`; forkserver.py does that start once and
forks the ranks from it."""
