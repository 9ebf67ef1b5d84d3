#!/bin/bash
# One H200 shared by 2 ranks: the host-cost comparison of the two launch routes, registered against staged
# collectives, and the quick GPU test matrix with the defaults (compiled launch on), then with the launch
# through ctypes (HPCCL_COMPILED_LAUNCH=0). Logs go to $OUT.
cd "$(dirname "$0")/.."
echo "##### defaults"
SUITE="launch registered tests2" HPCCL_TEST_QUICK=1 PYTEST_ARGS="-rs" T_TESTS2=200 bash bench/gpu_suite.sh
echo "##### HPCCL_COMPILED_LAUNCH=0"
HPCCL_COMPILED_LAUNCH=0 SUITE="tests2" HPCCL_TEST_QUICK=1 PYTEST_ARGS="-rs" T_TESTS2=200 bash bench/gpu_suite.sh
