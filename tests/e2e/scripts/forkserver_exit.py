"""What a rank leaves for Python's exit to finish, to compare a rank forked from phantora's fork server
with a fresh `python script.py` (PHANTORA_FORK_SERVER=0): a non-daemon thread still running, an
atexit handler, an object with __del__ in the script's globals, a file left open there and a gzip
file left open in another module (as a helper module of the script would hold it); rank 1 ends
with sys.exit(), rank 0 at the script's end. argv[1]: the folder to write the files in."""
import atexit
import gzip
import os
import sys
import threading
import types

import torch  # noqa: F401  (the interposition is installed here, as in any script)

rank = int(os.environ["RANK"])
folder = sys.argv[1]


def say(line):  # one write per line: the two threads' lines must not interleave
    os.write(1, f"{line}\n".encode())


class Noisy:
    def __del__(self):
        say(f"del rank {rank}")


script_ended = threading.Event()


def late_thread():
    script_ended.wait()  # its line comes after the script's last one, however the threads are scheduled
    total = sum(range(2_000_000))  # still running when the script's last line has run
    say(f"thread rank {rank} {total}")


noisy = Noisy()
atexit.register(lambda: say(f"atexit rank {rank}"))
left_open = open(os.path.join(folder, f"plain{rank}.txt"), "w")
left_open.write("unflushed " * 1000)
helper = sys.modules["forkserver_exit_helper"] = types.ModuleType("forkserver_exit_helper")
helper.log = gzip.open(os.path.join(folder, f"zipped{rank}.txt.gz"), "wt")
helper.log.write("compressed " * 1000)
del helper
threading.Thread(target=late_thread).start()
say(f"end of script rank {rank}")
script_ended.set()
if rank == 1:
    sys.exit()
