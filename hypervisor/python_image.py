"""The `python` image (SPEC §20): `debian` with Jupyter's ipykernel and the data
stack from Debian packages, so a code context's kernel is ipykernel (rift-code
drives it through jupyter_client) and `import pandas` works at once.

It is built from a recipe (SPEC §19), `python.Recipe` beside this module, by
Rift's builder (`rift image build python`: rift.services.builds.offline): the
host's apt fetches PACKAGES and what they need beyond `debian` as .debs
(hypervisor.debs), which the guest installs from the build's context; no guest
fetches anything. The recipe also sets numpy's BLAS and LAPACK to the reference
ones (OpenBLAS dies of SIGILL on QEMU's TCG CPU).
"""

from __future__ import annotations

from pathlib import Path

NAME = "python"
RECIPE = Path(__file__).with_name("python.Recipe")
PACKAGES = ("python3-ipykernel", "python3-jupyter-client", "python3-numpy",
            "python3-pandas", "python3-matplotlib",
            # the reference BLAS and LAPACK the recipe sets: named, since apt may take
            # OpenBLAS (which matplotlib's dependencies pull in) for numpy's libblas.so.3
            "libblas3", "liblapack3")
