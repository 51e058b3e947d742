"""`python -m dspark.ops.harness.gpu_check`: how scripts/gpu_check.sh runs the check without the dspark CLI."""
import sys

from dspark.ops.harness.gpu_check import main

sys.exit(main())
