"""Build hook: compile the native injection helper (attach/helper/fp_inject.c) at install time.

The helper is a plain shared library (no Python headers, no PyInit): gdb dlopen()s it inside
the target. It is optional: without a C compiler the install still succeeds and flight_profiler
compiles it on first use, or falls back to pending calls only (docs/attach.md).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "flight_profiler.attach._fp_inject",
            sources=["src/flight_profiler/attach/helper/fp_inject.c"],
            libraries=["dl"],
            extra_compile_args=["-pthread"],
            extra_link_args=["-pthread"],
            optional=True,
        )
    ]
)
