"""Build hook for the optional Rust extension `vox_serve._rt` (rust/, see rust/docs/README.md).

Everything else is configured in pyproject.toml. The extension is optional: without cargo (or
with a failed build) `pip install` still succeeds and prints a warning; vox-serve then serves
with the Python runtime.
"""

from setuptools import setup
from setuptools_rust import Binding, RustExtension

setup(
    rust_extensions=[
        RustExtension(
            "vox_serve._rt",
            path="rust/Cargo.toml",
            binding=Binding.PyO3,
            optional=True,
            py_limited_api=True,
            debug=False,
        )
    ],
    # One wheel for every CPython >= 3.11 (the crate builds against the stable ABI).
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
    zip_safe=False,
)
