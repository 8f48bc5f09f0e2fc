//! Build script: the CUDA parts of the extension are optional, so a machine without nvcc or
//! FlashInfer's headers still builds the rest (tokenizers, prompt builders, driver-API calls).
//!
//! - `kernels/sampling.cu` -> a fatbin for `VOX_CUDA_ARCHS` (those nvcc supports), embedded in the
//!   extension and loaded with the driver API at run time (cfg `vox_kernels`).
//! - `shim/planner.cu` -> FlashInfer's host-side planners from the headers of the installed
//!   `flashinfer-python` (or `FLASHINFER_INCLUDE`), linked in (cfg `vox_planner`). Nothing links
//!   libcudart: the shim answers the few runtime calls the planners make itself.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const DEFAULT_ARCHS: &str = "80,86,89,90,100,120";

fn main() {
    for var in ["VOX_CUDA_ARCHS", "CUDA_HOME", "FLASHINFER_INCLUDE", "FLASHINFER_VERSION", "PYO3_PYTHON"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    for path in ["kernels/sampling.cu", "shim/planner.cu", "build.rs"] {
        println!("cargo:rerun-if-changed={path}");
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let nvcc = find_nvcc();
    match &nvcc {
        Some(nvcc) => {
            build_kernels(nvcc, &out);
            build_planner(nvcc);
        }
        None => {
            println!("cargo:warning=nvcc not found (set CUDA_HOME): building without the CUDA sampling kernels and the FlashInfer planner");
            println!("cargo:rustc-env=VOX_KERNEL_ARCHS=");
            println!("cargo:rustc-env=VOX_FLASHINFER_VERSION=");
        }
    }
}

fn find_nvcc() -> Option<PathBuf> {
    let home = env::var("CUDA_HOME").unwrap_or_else(|_| "/usr/local/cuda".to_string());
    let candidates = [Path::new(&home).join("bin/nvcc"), PathBuf::from("nvcc")];
    candidates.into_iter().find(|c| Command::new(c).arg("--version").output().map(|o| o.status.success()).unwrap_or(false))
}

/// The requested architectures that this nvcc can compile for, in the requested order.
fn supported_archs(nvcc: &Path) -> Vec<u32> {
    let requested = env::var("VOX_CUDA_ARCHS").unwrap_or_else(|_| DEFAULT_ARCHS.to_string());
    let listed = Command::new(nvcc).arg("--list-gpu-code").output().map(|o| String::from_utf8_lossy(&o.stdout).to_string()).unwrap_or_default();
    let mut archs = Vec::new();
    for item in requested.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let arch: u32 = match item.parse() {
            Ok(a) => a,
            Err(_) => panic!("VOX_CUDA_ARCHS: {item:?} is not an SM number such as 90"),
        };
        if listed.split_whitespace().any(|code| code == format!("sm_{arch}")) {
            archs.push(arch);
        } else {
            println!("cargo:warning=VOX_CUDA_ARCHS: nvcc does not support sm_{arch}; skipped");
        }
    }
    archs
}

fn build_kernels(nvcc: &Path, out: &Path) {
    let archs = supported_archs(nvcc);
    if archs.is_empty() {
        println!("cargo:warning=no CUDA architecture left to build the sampling kernels for");
        println!("cargo:rustc-env=VOX_KERNEL_ARCHS=");
        return;
    }
    let fatbin = out.join("sampling.fatbin");
    let mut cmd = Command::new(nvcc);
    cmd.args(["-fatbin", "-O3", "-std=c++17", "-o"]).arg(&fatbin).arg("kernels/sampling.cu");
    for arch in &archs {
        cmd.arg(format!("-gencode=arch=compute_{arch},code=sm_{arch}"));
    }
    // PTX of the newest architecture too, so a newer GPU can still JIT the kernels.
    let newest = archs.iter().max().copied().unwrap_or(80);
    cmd.arg(format!("-gencode=arch=compute_{newest},code=compute_{newest}"));
    let status = cmd.status().expect("running nvcc");
    if !status.success() {
        panic!("nvcc failed to compile kernels/sampling.cu");
    }
    let list: Vec<String> = archs.iter().map(u32::to_string).collect();
    println!("cargo:rustc-cfg=vox_kernels");
    println!("cargo:rustc-env=VOX_KERNEL_ARCHS={}", list.join(","));
}

/// FlashInfer's include directory and version: `FLASHINFER_INCLUDE` (+ `FLASHINFER_VERSION`, or
/// the version recorded next to the headers), else the installed `flashinfer-python` package.
fn flashinfer_headers() -> Option<(PathBuf, String)> {
    if let Ok(include) = env::var("FLASHINFER_INCLUDE") {
        let include = PathBuf::from(include);
        let version = env::var("FLASHINFER_VERSION").ok().or_else(|| version_next_to(&include));
        return match version {
            Some(v) => Some((include, v)),
            None => {
                println!("cargo:warning=FLASHINFER_INCLUDE is set but its version is unknown: set FLASHINFER_VERSION");
                None
            }
        };
    }
    let python = env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".to_string());
    // find_spec does not import flashinfer (which needs a CUDA build of torch to import). The
    // site-packages directory is printed first: installing a package there reruns this script.
    let script = "import importlib.util, importlib.metadata, os, sysconfig\n\
                  print(sysconfig.get_paths()['purelib'])\n\
                  spec = importlib.util.find_spec('flashinfer')\n\
                  print(os.path.join(os.path.dirname(spec.origin), 'data', 'include'))\n\
                  print(importlib.metadata.version('flashinfer-python'))\n";
    // -I: pip builds wheels in an isolated environment (PYTHONPATH hides the installed packages);
    // the interpreter's own site-packages hold the flashinfer-python the build is meant to use.
    let output = Command::new(python).args(["-I", "-c", script]).output().ok()?;
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    let mut lines = text.lines();
    if let Some(site) = lines.next() {
        println!("cargo:rerun-if-changed={}", site.trim());
    }
    if !output.status.success() {
        return None;
    }
    let include = PathBuf::from(lines.next()?.trim());
    let version = lines.next()?.trim().to_string();
    Some((include, version))
}

/// `<pkg>/data/include` -> the version in `<pkg>/_build_meta.py` (how the wheel records it).
fn version_next_to(include: &Path) -> Option<String> {
    let meta = include.parent()?.parent()?.join("_build_meta.py");
    let text = std::fs::read_to_string(meta).ok()?;
    let line = text.lines().find(|l| l.starts_with("__version__"))?;
    Some(line.split('"').nth(1)?.to_string())
}

fn build_planner(nvcc: &Path) {
    let headers = flashinfer_headers().filter(|(inc, _)| inc.join("flashinfer/attention/scheduler.cuh").exists());
    let (include, version) = match headers {
        Some(found) => found,
        None => {
            println!("cargo:warning=FlashInfer headers not found (install flashinfer-python or set FLASHINFER_INCLUDE): building without the attention planner");
            println!("cargo:rustc-env=VOX_FLASHINFER_VERSION=");
            return;
        }
    };
    println!("cargo:rerun-if-changed={}", include.join("flashinfer/attention/scheduler.cuh").display());
    let archs = supported_archs(nvcc);
    let arch = archs.iter().min().copied().unwrap_or(80);
    // cc's CUDA mode finds nvcc through $NVCC (setting .compiler() would pass it gcc's flags).
    env::set_var("NVCC", nvcc);
    let mut build = cc::Build::new();
    build
        .cuda(true)
        .cudart("none")
        .file("shim/planner.cu")
        .include(&include)
        .flag("-std=c++17")
        // Host code only: the planners never launch a kernel, so one (the oldest) device target suffices.
        .flag(&format!("-arch=sm_{arch}"))
        .flag("-Xcompiler=-fvisibility=hidden")
        .warnings(false);
    match build.try_compile("vox_planner") {
        Ok(()) => {
            println!("cargo:rustc-cfg=vox_planner");
            println!("cargo:rustc-env=VOX_FLASHINFER_VERSION={version}");
        }
        Err(err) => {
            println!("cargo:warning=the FlashInfer planner shim did not compile against {} ({version}): {err}", include.display());
            println!("cargo:rustc-env=VOX_FLASHINFER_VERSION=");
        }
    }
}
