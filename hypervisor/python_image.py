"""The `python` image (SPEC §20): `debian` (hypervisor.debian) with Jupyter's
ipykernel and the data stack from Debian packages, so a code context's kernel is
ipykernel (rift-code drives it through jupyter_client) and `import pandas` works
at once. Built as `debian` is, by debootstrap from the Debian mirror apt uses, its
root cached beside debian's under its own key; nothing comes from elsewhere and no
guest fetches anything.

Until the recipe builder (SPEC §19) makes it from a recipe, this is how it is
made: `rift image build python`.
"""

from __future__ import annotations

from pathlib import Path

from hypervisor.debian import Variant, build_debian

NAME = "python"
PACKAGES = ("python3-ipykernel", "python3-jupyter-client", "python3-numpy",
            "python3-pandas", "python3-matplotlib",
            # what provides two virtual packages in their dependencies, which debootstrap
            # does not resolve by itself (python3-zmq's cffi, gdb's boost regex)
            "python3-cffi-backend", "libboost-regex1.74.0")


# numpy's BLAS and LAPACK: the reference ones, not OpenBLAS (which the data stack pulls
# in). OpenBLAS picks its kernels by the CPU it finds, and on QEMU's TCG CPU (AMD's
# vendor, few features) it takes Opteron kernels with 3DNow! instructions (`femms` in
# dgemm_otcopy_OPTERON_SSE3) that TCG lacks: a matplotlib plot died of SIGILL.
LIB = "/usr/lib/x86_64-linux-gnu"
IN_ROOT = (
    ("update-alternatives", "--set", "libblas.so.3-x86_64-linux-gnu", f"{LIB}/blas/libblas.so.3"),
    ("update-alternatives", "--set", "liblapack.so.3-x86_64-linux-gnu",
     f"{LIB}/lapack/liblapack.so.3"),
)


def build_python(images_dir: Path, *, cache_dir: Path | None = None,
                 force: bool = False) -> Path:
    """Build `python` into `images_dir/python/` and answer that folder (skipped when
    it was made from the same inputs, unless `force`)."""
    return build_debian(images_dir, cache_dir=cache_dir, force=force,
                        variant=Variant(NAME, PACKAGES, IN_ROOT))
