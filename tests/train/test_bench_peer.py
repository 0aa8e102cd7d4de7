#!/usr/bin/python3
"""The benchmarks' check that PyTorch is a fair peer (bench/bench_common.py):
a PyTorch process made to load the reference BLAS (LD_LIBRARY_PATH, as on a
fresh Debian machine) is named as such and no ratio is printed: the check
stops with the fix. With the system's BLAS, OpenBLAS once scripts/deps.sh
has run, it is named and passes. The library names are classified from
their paths as Debian installs them. Skipped (77) where the reference BLAS
is not installed to be loaded.

usage: test_bench_peer.py path/to/dtrain
"""
import argparse
import io
import os
import sys
import tempfile
from contextlib import redirect_stdout

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_common  # noqa: E402

REF_DIR = "/usr/lib/x86_64-linux-gnu/blas"
failures = 0


def check(cond, what):
    global failures
    if not cond:
        print("FAIL:", what)
        failures += 1


def check_peer(dtrain):
    """check_peer's result, or the message it stopped with, and its output."""
    out = io.StringIO()
    a = argparse.Namespace(dtrain=dtrain, no_install=True)
    try:
        with redirect_stdout(out):
            return bench_common.check_peer(a), None, out.getvalue()
    except SystemExit as e:
        return None, str(e.code), out.getvalue()


def main():
    dtrain = sys.argv[1]
    os.environ["DTRAIN_CACHE"] = tempfile.mkdtemp()
    os.environ.pop("DTRAIN_PEAK_GFLOPS", None)

    name = bench_common.blas_name
    check(name(["/usr/lib/x86_64-linux-gnu/blas/libblas.so.3.11.0"])[0].startswith("reference"),
          "netlib's path")
    check(name(["/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"])[0] == "OpenBLAS",
          "OpenBLAS's libblas")
    check(name(["/opt/intel/lib/libmkl_rt.so.2"])[0] == "MKL", "MKL")
    check(name([])[0] == "no BLAS library mapped", "nothing mapped")

    if not os.path.exists(os.path.join(REF_DIR, "libblas.so.3")):
        print("skipped: no reference BLAS in %s to load" % REF_DIR)
        return 77
    saved = os.environ.get("LD_LIBRARY_PATH")
    os.environ["LD_LIBRARY_PATH"] = REF_DIR
    res, msg, out = check_peer(dtrain)
    if saved is None:
        del os.environ["LD_LIBRARY_PATH"]
    else:
        os.environ["LD_LIBRARY_PATH"] = saved
    print(out + (msg or ""))
    check(res is None and msg, "a crippled peer was accepted")
    check("BLAS: reference BLAS" in out, "the reference BLAS was not named")
    check(msg and "No comparison" in msg and "libopenblas0-pthread" in msg
          and "update-alternatives --set" in msg, "no fix in the message")

    res, msg, out = check_peer(dtrain)
    print(out + (msg or ""))
    system = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    if "openblas" in system:
        check(res is not None, "OpenBLAS refused: %s" % msg)
        check("BLAS: OpenBLAS" in out, "OpenBLAS not named")
    else:
        check(res is None, "the system's %s accepted" % system)
    print("train.bench_peer: %s" % ("ok" if failures == 0 else "%d failure(s)" % failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
