"""Finds an installed LibTorch and exposes it as @libtorch//:libtorch. Nothing is downloaded.

Search order:
  1. $LIBTORCH: a LibTorch root with include/ and lib/ (a LibTorch zip, or a PyTorch install's torch/ folder).
  2. The LibTorch inside the PyTorch that `python3` (or $PYTHON) imports.
  3. Debian's libtorch-dev (headers in /usr/include, libraries in /usr/lib/<triplet>).

A CUDA build (libtorch_cuda + libc10_cuda present) is linked with --no-as-needed so that its CUDA hooks
register and torch::cuda::is_available() can be true. The generated @libtorch//:defs.bzl tells BUILD files
whether CUDA is present (LIBTORCH_HAS_CUDA), and the library defines WORKSHOP_HAS_CUDA=0/1 for C++.
"""

load("//third_party/local:local.bzl", "resolve_path")

_PY_PROBE = """
import os, sys
import torch
root = os.path.dirname(torch.__file__)
print(root)
print(int(getattr(torch._C, '_GLIBCXX_USE_CXX11_ABI', True)))
print(torch.__version__)
"""

_DEBIAN_LIBDIRS = ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"]

def _find_python_torch(ctx):
    python = ctx.os.environ.get("PYTHON", "python3")
    if ctx.which(python) == None:
        return None
    result = ctx.execute([python, "-c", _PY_PROBE], timeout = 120, quiet = True)
    if result.return_code != 0:
        return None
    lines = result.stdout.strip().split("\n")
    if len(lines) < 3:
        return None
    return struct(root = lines[0], abi = lines[1], version = lines[2])

def _locate(ctx):
    """Returns struct(include, libdir, abi, origin)."""
    explicit = ctx.os.environ.get("LIBTORCH", "")
    if explicit:
        root = resolve_path(ctx, explicit)
        if not root.get_child("include").exists or not root.get_child("lib").exists:
            fail("LIBTORCH=%s has no include/ and lib/ folders" % explicit)
        return struct(include = str(root.get_child("include")), libdir = str(root.get_child("lib")),
                      abi = "", origin = "$LIBTORCH=" + explicit)
    py = _find_python_torch(ctx)
    if py != None and ctx.path(py.root + "/include/torch").exists:
        return struct(include = py.root + "/include", libdir = py.root + "/lib", abi = py.abi,
                      origin = "PyTorch %s at %s" % (py.version, py.root))
    for libdir in _DEBIAN_LIBDIRS:
        if ctx.path(libdir + "/libtorch.so").exists and ctx.path("/usr/include/torch/csrc/api/include").exists:
            package = "libtorch-cuda-dev" if ctx.path(libdir + "/libtorch_cuda.so").exists else "libtorch-dev"
            return struct(include = "/usr/include", libdir = libdir, abi = "", origin = "Debian " + package)
    fail("LibTorch not found. Run tools/setup.sh (Debian: libtorch-dev), install PyTorch for python3, " +
         "or set LIBTORCH to a LibTorch root (the folder with include/ and lib/).")

def _find_cuda_include(ctx, lt):
    """Folders with the CUDA headers that ATen's and c10's CUDA headers include (cuda_runtime_api.h, cublas_v2.h...).

    A CUDA toolkit ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda, beside nvcc) comes first; the headers that pip's
    nvidia-* packages install beside torch (site-packages/nvidia/<part>/include, or one level deeper) follow.
    """
    toolkit = []
    for var in ["CUDA_HOME", "CUDA_PATH"]:
        if ctx.os.environ.get(var, ""):
            toolkit.append(ctx.os.environ[var] + "/include")
    toolkit.append("/usr/local/cuda/include")
    nvcc = ctx.which("nvcc")
    if nvcc != None:
        toolkit.append(str(nvcc.dirname.dirname) + "/include")
    # Debian's nvidia-cuda-dev puts the CUDA headers straight into /usr/include, which the compiler searches
    # anyway: nothing to add then (linking /usr/include into the repository would glob the whole system).
    if lt.include == "/usr/include" and ctx.path("/usr/include/cuda_runtime_api.h").exists:
        return []
    found = []
    for c in toolkit:
        if ctx.path(c + "/cuda_runtime_api.h").exists and c not in found:
            found.append(c)
            break
    nvidia = ctx.path(str(ctx.path(lt.libdir).dirname.dirname) + "/nvidia")
    if nvidia.exists:
        for part in nvidia.readdir():
            if "." in part.basename or part.basename.startswith("__"):
                continue  # __init__.py, __pycache__: not header packages
            for candidate in [part.get_child("include")] + [sub.get_child("include") for sub in part.readdir()
                                                             if sub.get_child("include").exists]:
                if candidate.exists and str(candidate) not in found:
                    found.append(str(candidate))
    return found

def _find_nvcc(ctx):
    """nvcc for lesson 6's CUDA kernels: $NVCC, then beside $CUDA_HOME / $CUDA_PATH, on PATH, /usr/local/cuda."""
    if ctx.os.environ.get("NVCC", ""):
        nvcc = ctx.path(ctx.os.environ["NVCC"])
        if not nvcc.exists:
            fail("NVCC=%s does not exist" % ctx.os.environ["NVCC"])
        return nvcc
    for var in ["CUDA_HOME", "CUDA_PATH"]:
        if ctx.os.environ.get(var, "") and ctx.path(ctx.os.environ[var] + "/bin/nvcc").exists:
            return ctx.path(ctx.os.environ[var] + "/bin/nvcc")
    found = ctx.which("nvcc")
    if found != None:
        return found
    if ctx.path("/usr/local/cuda/bin/nvcc").exists:
        return ctx.path("/usr/local/cuda/bin/nvcc")
    return None

def _find_cudart(ctx, nvcc, lt):
    """Linker flags for the CUDA runtime that nvcc's objects call (cudaLaunchKernel, the fat-binary hooks)."""
    real = nvcc.realpath
    dirs = [str(real.dirname.dirname) + "/lib64", str(real.dirname.dirname) + "/lib", lt.libdir] + _DEBIAN_LIBDIRS
    for d in dirs:
        if ctx.path(d + "/libcudart.so").exists:
            return ["-L" + d, "-Wl,-rpath," + d, "-lcudart"]
    # pip's nvidia-cuda-runtime package has only the versioned file (libcudart.so.12 or .13).
    nvidia = ctx.path(str(ctx.path(lt.libdir).dirname.dirname) + "/nvidia")
    if nvidia.exists:
        for part in nvidia.readdir():
            if "." in part.basename or part.basename.startswith("__"):
                continue  # __init__.py, __pycache__: not library packages
            libs = [part.get_child("lib")] + [sub.get_child("lib") for sub in part.readdir() if "." not in sub.basename]
            for lib in libs:
                if not lib.exists:
                    continue
                for f in lib.readdir():
                    if f.basename.startswith("libcudart.so."):
                        return ["-L" + str(lib), "-Wl,-rpath," + str(lib), "-l:" + f.basename]
    return []

def _libtorch_repository_impl(ctx):
    lt = _locate(ctx)
    include = ctx.path(lt.include)
    if include.get_child("torch").exists == False:
        fail("%s has no torch/ headers" % lt.include)

    # Only the folders LibTorch owns are linked into the repository (the rest of /usr/include is the compiler's).
    owned = ["ATen", "c10", "caffe2", "torch"]
    if lt.include == "/usr/include":
        children = [include.get_child(name) for name in owned if include.get_child(name).exists]
    else:
        children = include.readdir()
    for child in children:
        ctx.symlink(child, "include/" + child.basename)

    libdir = ctx.path(lt.libdir)
    has_cuda = libdir.get_child("libtorch_cuda.so").exists and libdir.get_child("libc10_cuda.so").exists
    cuda_includes = []
    cuda_headers = "none"
    if has_cuda:
        for i, folder in enumerate(_find_cuda_include(ctx, lt)):
            ctx.symlink(folder, "cuda_include_%d" % i)
            cuda_includes.append("cuda_include_%d" % i)
        if cuda_includes:
            cuda_headers = ", ".join([str(ctx.path(c).realpath) for c in cuda_includes])
        elif ctx.path("/usr/include/cuda_runtime_api.h").exists:
            cuda_headers = "/usr/include (Debian's nvidia-cuda-dev)"
        else:
            print("LibTorch at %s is a CUDA build, but no CUDA headers (cuda_runtime_api.h) were found: " % lt.libdir +
                  "set CUDA_HOME to a CUDA toolkit. Files that include ATen's CUDA headers will not compile.")

    # nvcc, for the lesson's own CUDA kernels (lesson 6). Only with a CUDA LibTorch, and only with a CUDA runtime
    # library to link them against.
    nvcc = _find_nvcc(ctx) if has_cuda else None
    cudart = _find_cudart(ctx, nvcc, lt) if nvcc != None else []
    if nvcc != None and not cudart:
        print("nvcc found at %s but no libcudart: lesson 6's CUDA kernels are not built" % nvcc)
        nvcc = None
    nvcc_flags = [f for f in ctx.os.environ.get("NVCC_FLAGS", "").split(" ") if f]

    macros = ctx.read(include.get_child("c10").get_child("macros").get_child("cmake_macros.h"))
    uses_glog = "#define C10_USE_GLOG" in macros

    version_h = include.get_child("torch").get_child("csrc").get_child("api").get_child("include") \
        .get_child("torch").get_child("version.h")
    if not version_h.exists:
        version_h = include.get_child("torch").get_child("version.h")
    if not version_h.exists:
        fail("%s: no torch/version.h found under %s" % (lt.origin, lt.include))
    version = ctx.read(version_h)
    major = version.split("#define TORCH_VERSION_MAJOR ")[1].split("\n")[0].strip()
    minor = version.split("#define TORCH_VERSION_MINOR ")[1].split("\n")[0].strip()

    libs = ["-ltorch", "-ltorch_cpu", "-lc10"]
    if has_cuda:
        libs = ["-ltorch_cuda", "-lc10_cuda"] + libs
    linkopts = ["-L" + lt.libdir, "-Wl,-rpath," + lt.libdir, "-Wl,--no-as-needed"] + libs + ["-Wl,--as-needed"]
    if uses_glog:
        linkopts += ["-lglog", "-lgflags"]
    linkopts += ["-lpthread"]

    defines = ["WORKSHOP_HAS_CUDA=%d" % (1 if has_cuda else 0)]
    if lt.abi == "0":
        defines.append("_GLIBCXX_USE_CXX11_ABI=0")

    ctx.file("BUILD", """\
package(default_visibility = ["//visibility:public"])

# {origin}, LibTorch {major}.{minor}, CUDA: {cuda}, CUDA headers: {cuda_headers}
cc_library(
    name = "libtorch",
    hdrs = glob(["include/**"], exclude_directories = 1) + glob(["{cuda_glob}/**/*.h*"]),
    defines = {defines},
    includes = ["include", "include/torch/csrc/api/include"] + {cuda_includes},
    linkopts = {linkopts},
)
""".format(
        origin = lt.origin,
        major = major,
        minor = minor,
        cuda = has_cuda,
        cuda_headers = cuda_headers,
        defines = repr(defines),
        cuda_glob = "cuda_include_*" if has_cuda else "no_cuda",
        cuda_includes = repr(cuda_includes),
        linkopts = repr(linkopts),
    ))
    ctx.file("defs.bzl", """\
\"\"\"Facts about the LibTorch this workspace found ({origin}).\"\"\"
LIBTORCH_HAS_CUDA = {cuda}
LIBTORCH_VERSION = ({major}, {minor})
LIBTORCH_ORIGIN = "{origin}"
LIBTORCH_CUDA_HEADERS = "{cuda_headers}"
# nvcc for the project's own .cu files ("" where there is none or LibTorch has no CUDA), the extra flags from
# $NVCC_FLAGS (e.g. -arch=sm_90), and how to link the CUDA runtime its objects call.
NVCC = "{nvcc}"
NVCC_FLAGS = {nvcc_flags}
CUDART_LINKOPTS = {cudart}
""".format(origin = lt.origin, cuda = has_cuda, major = major, minor = minor, cuda_headers = cuda_headers,
           nvcc = str(nvcc) if nvcc != None else "", nvcc_flags = repr(nvcc_flags), cudart = repr(cudart)))

libtorch_repository = repository_rule(
    implementation = _libtorch_repository_impl,
    environ = ["LIBTORCH", "PYTHON", "CUDA_HOME", "CUDA_PATH", "PATH", "NVCC", "NVCC_FLAGS"],
    local = True,
)
