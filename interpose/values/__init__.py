"""What tensors without data read as (docs/moe.md): the value policy for reads and how values
flow through ops, copies and collectives (policy.py), ops whose output shape depends on data
(data_dependent.py), and MoE routing decisions over scores nobody holds (routing.py)."""
