"""The data path's decisions, sans-IO: an exchange in, a plan about its bytes out.

    request in --> decode --> numbering --> rules --> RequestPlan  (io carries it out)
    delivery   --> numbering (broker side; guard mode may refuse)
    answer in  --> rules (response) --> ResponsePlan --> addresses, facts, rewrite --> Answered

Each stage is a module of its own (decode, numbering, rules, addresses,
holds, answers); `Pipeline` (path.py) only runs them in order. No stage awaits, reads a
clock or touches a socket: the shell (kproxy/io) passes in the time and does
the I/O, and nothing here calls back up into it.
"""
