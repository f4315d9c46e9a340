"""Checks spack/packages/tiled-lse/package.py without Spack (CI has none; docs/spack.md says how
the recipe was run with a real Spack): a tiny stand-in for the `spack.package` API records the
directives, then the test checks the variants, the dependencies (Kokkos backend, its wrapper,
cuda_arch propagation to Kokkos and NCCL, CUDA and CUTLASS of the Hopper kernels), the conflicts,
cmake_args and the run environment.
Run: python3 spack/test_recipe.py (ctest runs it)."""
import importlib.util
import os
import sys
import tempfile
import types

RECIPE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "packages", "tiled-lse", "package.py")
recorded = {"variant": {}, "depends_on": [], "conflicts": [], "version": [], "extends": []}


def _directive(kind):
    def record(*args, **kwargs):
        if kind == "variant":
            recorded["variant"][args[0]] = kwargs
        else:
            recorded[kind].append((args, kwargs))
    return record


class Prefix(str):
    """An install prefix: prefix.bin.nvcc is '<prefix>/bin/nvcc', as with Spack's Prefix."""

    def __getattr__(self, name):
        return Prefix(self + "/" + name)


class Spec:
    """`spec` with a set of satisfied constraints such as '+cuda' or 'cuda_arch=90'."""

    def __init__(self, *constraints, kokkos_prefix=None):
        self.constraints = set(constraints)
        # An external Kokkos at this prefix (a folder holding its CMake config), else a Spack-built one.
        self.kokkos_prefix = kokkos_prefix

    def satisfies(self, constraint):
        return all(c in self.constraints for c in constraint.split())

    def __contains__(self, constraint):
        return self.satisfies(constraint)

    def __getitem__(self, name):
        dep = types.SimpleNamespace(prefix=Prefix("/opt/" + name), kokkos_cxx="/opt/kokkos/bin/nvcc_wrapper",
                                    external=False)
        if name == "kokkos" and self.kokkos_prefix:
            # Spack's kokkos package gives an external Kokkos the spec's C++ compiler as kokkos_cxx.
            dep.prefix, dep.external, dep.kokkos_cxx = Prefix(self.kokkos_prefix), True, "/spack/env/c++"
        dep.command = types.SimpleNamespace(path="/opt/python/bin/python3")
        dep.package = types.SimpleNamespace(platlib="lib/python3.11/site-packages")
        return dep


class CMakePackage:
    run_tests = False
    prefix = "/opt/tiled-lse"
    compiler = types.SimpleNamespace(cxx="/usr/bin/g++-12")

    def __init__(self, spec):
        self.spec = spec

    @staticmethod
    def define(name, value):
        if isinstance(value, bool):
            value = "ON" if value else "OFF"
        return "-D%s=%s" % (name, value)

    def define_from_variant(self, name, variant):
        return self.define(name, self.spec.satisfies("+" + variant))


class CudaPackage:
    cuda_arch_values = ("70", "80", "90")


def build_stub():
    package = types.ModuleType("spack.package")
    for kind in recorded:
        setattr(package, kind, _directive(kind))
    package.CMakePackage, package.CudaPackage = CMakePackage, CudaPackage
    package.run_after = lambda phase: (lambda f: f)
    for name in ("which", "working_dir", "join_path", "cache_extra_test_sources"):
        setattr(package, name, lambda *a, **k: None)
    # Spack sets python_platlib in an extension's module (python-venv's setup_dependent_package).
    package.python_platlib = CMakePackage.prefix + "/lib/python3.11/site-packages"
    package.find = lambda root, name: [os.path.join(d, name) for d, _, files in os.walk(root) if name in files]
    package.InstallError = type("InstallError", (Exception,), {})
    package.SkipTest = type("SkipTest", (Exception,), {})
    package.test_part = None
    package.find_libraries = lambda name, root, recursive=False: [root + "/lib/" + name + ".so"]
    package.__all__ = [n for n in vars(package) if not n.startswith("_")]
    spack = types.ModuleType("spack")
    spack.package = package
    sys.modules["spack"], sys.modules["spack.package"] = spack, package


def load_recipe():
    build_stub()
    spec = importlib.util.spec_from_file_location("tiled_lse_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TiledLse


def main():
    TiledLse = load_recipe()
    assert {"openmp", "mpi", "nccl", "python", "hopper", "apps"} <= set(recorded["variant"]), recorded["variant"]
    # tlse needs Kokkos Kernels, which the library does not: a variant, off by default.
    assert recorded["variant"]["apps"]["default"] is False, recorded["variant"]["apps"]
    # On by default, and only where it can be built: the Hopper kernels are sm_90a code.
    hopper = recorded["variant"]["hopper"]
    assert hopper["default"] is True and hopper["when"] == "+cuda cuda_arch=90", hopper
    deps = {(args[0], kwargs.get("when")) for args, kwargs in recorded["depends_on"]}
    for arch in CudaPackage.cuda_arch_values:
        assert ("kokkos+cuda cuda_arch=%s" % arch, "+cuda cuda_arch=%s" % arch) in deps, arch
        # Spack's NCCL refuses cuda_arch=none: it gets TiledLSE's architectures.
        assert ("nccl cuda_arch=%s" % arch, "+nccl cuda_arch=%s" % arch) in deps, arch
    assert not [d for d in deps if d[0] == "nccl"], "nccl without cuda_arch"
    for expected in [("kokkos@3.4:", None), ("kokkos+openmp", "+openmp"), ("kokkos+cuda_lambda", "+cuda"),
                     ("kokkos+wrapper", "+cuda"), ("mpi", "+mpi"), ("py-torch", "+python"),
                     ("cuda@12.4:", "+hopper"), ("cutlass@3.5: +cuda cuda_arch=90", "+hopper"),
                     ("kokkos-kernels@3.4:", "+apps")]:
        assert expected in deps, expected
    # CUTLASS is headers compiled into the library: a build dependency only.
    cutlass = [kwargs for args, kwargs in recorded["depends_on"] if args[0].startswith("cutlass")]
    assert cutlass == [{"when": "+hopper", "type": "build"}], cutlass
    conflicts = {(args[0], kwargs.get("when")) for args, kwargs in recorded["conflicts"]}
    assert ("+cuda", "cuda_arch=none") in conflicts and ("+nccl", "~cuda") in conflicts, conflicts
    assert ("^cuda@:12.3", "+hopper") in conflicts, conflicts
    for arch in CudaPackage.cuda_arch_values:
        assert (("+hopper", "cuda_arch=%s" % arch) in conflicts) == (arch != "90"), (arch, conflicts)
    # Not a checkout of CUTLASS's main branch, which a plain cutlass@3.5: would take in Spack 0.22.
    assert {("^cutlass@main", "+hopper"), ("^cutlass@master", "+hopper")} <= conflicts, conflicts
    old_cuda = [kwargs["msg"] for args, kwargs in recorded["conflicts"] if args[0] == "^cuda@:12.3"]
    assert "12.4" in old_cuda[0] and "~hopper" in old_cuda[0], old_cuda
    assert TiledLse.git.startswith("file://"), TiledLse.git
    assert callable(getattr(TiledLse, "test_examples")) and TiledLse.test_requires_compiler

    host = TiledLse(Spec("+openmp")).cmake_args()
    assert "-DKokkos_ROOT=/opt/kokkos" in host and "-DTiledLSE_ENABLE_CUDA=OFF" in host, host
    assert not any(a.startswith("-DCMAKE_CXX_COMPILER") for a in host), host
    hopper_options = ("-DTiledLSE_HOPPER_CUDA_COMPILER", "-DTiledLSE_HOPPER_HOST_COMPILER", "-DCUTLASS_INCLUDE_DIR")
    assert "-DTiledLSE_ENABLE_HOPPER=OFF" in host and not any(a.startswith(hopper_options) for a in host), host
    assert "-DTiledLSE_ENABLE_APPS=OFF" in host, host
    assert "-DTiledLSE_ENABLE_APPS=ON" in TiledLse(Spec("+openmp", "+apps")).cmake_args()
    cuda = TiledLse(Spec("+cuda", "cuda_arch=90", "+nccl", "+python")).cmake_args()
    for expected in ("-DTiledLSE_ENABLE_CUDA=ON", "-DTiledLSE_ENABLE_NCCL=ON", "-DTiledLSE_ENABLE_PYTHON=ON",
                     "-DCMAKE_CXX_COMPILER=/opt/kokkos/bin/nvcc_wrapper",
                     "-DTiledLSE_PYTHON_INSTALL_DIR=lib/python3.11/site-packages"):
        assert expected in cuda, (expected, cuda)
    assert "-DTiledLSE_ENABLE_HOPPER=OFF" in cuda and not any(a.startswith(hopper_options) for a in cuda), cuda
    # +hopper (the default for +cuda cuda_arch=90): the spec's nvcc, not Kokkos' wrapper, builds
    # the kernels, with the spec's C++ compiler as host compiler and the CUTLASS headers.
    hopper = TiledLse(Spec("+cuda", "cuda_arch=90", "+hopper")).cmake_args()
    for expected in ("-DTiledLSE_ENABLE_CUDA=ON", "-DTiledLSE_ENABLE_HOPPER=ON",
                     "-DCMAKE_CXX_COMPILER=/opt/kokkos/bin/nvcc_wrapper",
                     "-DTiledLSE_HOPPER_CUDA_COMPILER=/opt/cuda/bin/nvcc",
                     "-DTiledLSE_HOPPER_HOST_COMPILER=/usr/bin/g++-12",
                     "-DCUTLASS_INCLUDE_DIR=/opt/cutlass/include"):
        assert expected in hopper, (expected, hopper)
    # An external Kokkos (no kokkos-nvcc-wrapper node): the compiler its CMake config records, not
    # the spec's plain C++ compiler that Spack's kokkos package hands out.
    with tempfile.TemporaryDirectory() as prefix:
        config = os.path.join(prefix, "lib", "cmake", "Kokkos")
        os.makedirs(config)
        with open(os.path.join(config, "KokkosConfigCommon.cmake"), "w") as f:
            f.write('SET(Kokkos_CXX_COMPILER "%s/bin/nvcc_sm90")\n' % prefix)
        external = TiledLse(Spec("+cuda", "cuda_arch=90", kokkos_prefix=prefix)).cmake_args()
        assert "-DCMAKE_CXX_COMPILER=%s/bin/nvcc_sm90" % prefix in external, external
        os.remove(os.path.join(config, "KokkosConfigCommon.cmake"))
        try:
            TiledLse(Spec("+cuda", "cuda_arch=90", kokkos_prefix=prefix)).cmake_args()
            raise AssertionError("an external Kokkos without a recorded compiler was accepted")
        except sys.modules["spack.package"].InstallError as error:
            assert "Kokkos_CXX_COMPILER" in str(error) and prefix in str(error), error
    environment = types.SimpleNamespace(values={})
    environment.set = lambda name, value: environment.values.__setitem__(name, value)
    TiledLse(Spec("+python")).setup_run_environment(environment)
    assert environment.values == {"TILEDLSE_LIBRARY": "/opt/tiled-lse/lib/libtiledlse_c.so"}, environment.values
    print("spack recipe OK: %d variants, %d dependencies, cmake_args for host, +apps, +cuda cuda_arch=90 ~hopper, "
          "+hopper and an external Kokkos"
          % (len(recorded["variant"]), len(recorded["depends_on"])))


if __name__ == "__main__":
    main()
