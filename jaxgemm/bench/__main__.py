"""python -m jaxgemm.bench: the GEMM suites (jaxgemm.bench.gemm)."""

import sys

from jaxgemm.bench.gemm import main

sys.exit(main())
