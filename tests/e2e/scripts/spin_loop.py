"""A pure-Python loop whose bytecode the counted host's test reads with `dis`."""


def spin(n):
    x = 0
    for i in range(n):
        x = x + i
    return x
