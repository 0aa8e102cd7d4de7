"""st_same.py A B: exit 0 when two safetensors files hold the same tensors
with the same bits, else 1 (for the shell tests)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from dtrain_ref import st_read  # noqa: E402
from dtrain_run import same_bits  # noqa: E402

a, b = st_read(sys.argv[1])[0], st_read(sys.argv[2])[0]
if not same_bits(a, b):
    sys.exit("%s and %s differ" % (sys.argv[1], sys.argv[2]))
print("same bits: %d tensors" % len(a))
