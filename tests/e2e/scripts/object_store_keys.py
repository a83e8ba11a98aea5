"""Object collectives move their pickles through the c10d store: prints, on rank 0, how many keys
the store holds after one round of all_gather_object, broadcast_object_list and gather_object, and
after 30 more (it must not grow with the rounds). Counted once every rank has finished its calls
(in real time: simulated collectives do not hold a rank back until its peers arrive), less the
keys that settle() itself adds."""
import os

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

rank = int(os.environ["RANK"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
world = dist.get_world_size()


def one_round(i: int) -> None:
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "round": i})
    assert gathered == [{"rank": r, "round": i} for r in range(world)], gathered
    sent = [f"round {i} from rank {rank}"]
    dist.broadcast_object_list(sent, src=1)
    assert sent == [f"round {i} from rank 1"], sent
    to_root = [None] * world if rank == 0 else None
    dist.gather_object(rank * i, to_root, dst=0)
    assert rank != 0 or to_root == [r * i for r in range(world)], to_root




def settle(tag: str) -> int | None:
    """On rank 0: the store's keys once every rank got here and before any goes on, less this
    function's own (world each call, and one more once a call has ended)."""
    store = c10d._get_default_store()
    store.set(f"settled/{tag}/{rank}", b"1")
    count = None
    if rank == 0:
        store.wait([f"settled/{tag}/{r}" for r in range(world)])
        count = store.num_keys() - world * (1 + (tag == "after")) - (tag == "after")
        store.set(f"settled/{tag}/counted", b"1")
    store.wait([f"settled/{tag}/counted"])
    return count


one_round(0)
before = settle("before")
for i in range(1, 31):
    one_round(i)
after = settle("after")
if rank == 0:
    print(f"store keys after 1 round {before}, after 31 rounds {after}", flush=True)
dist.destroy_process_group()
