"""Choosing what Synkhronos prints: its status lines are log records of the
``synkhronos`` logger, at level INFO.
"""

import logging

import synkhronos as synk

seen = []                                            # a handler of your own, to see the records
keep = logging.Handler()
keep.emit = lambda record: seen.append(record.getMessage())
logging.getLogger("synkhronos").addHandler(keep)

synk.fork(2)                                         # "Synkhronos attempting to use 2 of ..."
synk.close()
assert any("attempting to use 2" in line for line in seen)
print(seen[0])                                       # which devices it started on

logging.getLogger("synkhronos").setLevel(logging.WARNING)   # quiet from here on
seen.clear()
synk.fork(2)
synk.close()
assert seen == [], seen
print("All assertions passed.")
