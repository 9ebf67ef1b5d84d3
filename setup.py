"""The one thing pyproject.toml cannot say: hpccl's compiled hot path (hpccl/_hotpath.c). It is optional:
without a C compiler the install still succeeds and the same calls run in Python (hpccl-info says which)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("hpccl._hotpath", ["hpccl/_hotpath.c"], extra_compile_args=["-O3", "-std=c11"],
                             optional=True)])
