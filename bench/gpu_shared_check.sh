#!/bin/bash
# One H200 shared by 2 ranks: the quick GPU test matrix with the compiled launch on (and the host-cost
# comparison of the two launch routes), then with the defaults. Logs go to $OUT.
cd "$(dirname "$0")/.."
echo "##### HPCCL_COMPILED_LAUNCH=1"
HPCCL_COMPILED_LAUNCH=1 SUITE="launch tests2" HPCCL_TEST_QUICK=1 PYTEST_ARGS="-rs" T_TESTS2=200 bash bench/gpu_suite.sh
echo "##### defaults"
SUITE="tests2" HPCCL_TEST_QUICK=1 PYTEST_ARGS="-rs" T_TESTS2=200 bash bench/gpu_suite.sh
