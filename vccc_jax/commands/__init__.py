"""Layer 6: one module per ``vccc`` command -- argparse, calls into the library, printing.

Every command's ``main(argv) -> int``; bad input exits 2 with one line
``vccc <command>: <what is wrong>`` on stderr (``commands.common.guarded``).
"""
