//! The instruction-count plugin (`gateway/bench/qemu-plugin/icount.c`, GPL-2.0-or-later, a QEMU
//! TCG plugin of API version 1): compiled with the host's `gcc` into a shared object that QEMU
//! loads, and checked against a known loop before any figure is trusted. The C sources are
//! compiled into tern-bench as text, so the bench needs no checkout to build it.
//!
//! It never counts anything itself: QEMU runs the plugin, which writes `insns N` at exit (and,
//! asked to, its block counts for `symbols.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::Arch;
use crate::BenchError;

const PLUGIN_C: &str = include_str!("../../qemu-plugin/icount.c");
const PLUGIN_API_H: &str = include_str!("../../qemu-plugin/qemu-plugin-api.h");
const LOOP_AARCH64: &str = include_str!("../../qemu-plugin/loop-aarch64.S");
const LOOP_ARMV7: &str = include_str!("../../qemu-plugin/loop-armv7.S");

/// Passes of the known loop in the short run; the long run makes twice as many.
pub const LOOP_PASSES: u64 = 1_000_000;
/// Instructions of one pass of the known loop (add, subs, branch).
pub const LOOP_PASS_INSNS: u64 = 3;
/// Instructions of the known loop's program outside the loop: the load of the pass count
/// before it, and the three of the exit system call after it.
pub const LOOP_FIXED_INSNS: u64 = 4;

/// The compiled plugin in a work directory of the bench.
#[derive(Debug)]
pub struct Plugin {
    pub so: PathBuf,
    dir: PathBuf,
}

/// The known loop's counts on one architecture: `passes` and twice as many.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SelfTest {
    pub arch: Arch,
    pub passes: u64,
    pub short: u64,
    pub long: u64,
}

impl SelfTest {
    /// Whether both counts are exactly what the program executes.
    pub fn exact(&self) -> bool {
        self.short == expected_loop_insns(self.passes)
            && self.long == expected_loop_insns(2 * self.passes)
    }
}

/// Every instruction the known loop's program executes for `passes` passes.
pub fn expected_loop_insns(passes: u64) -> u64 {
    LOOP_FIXED_INSNS + LOOP_PASS_INSNS * passes
}

impl Plugin {
    /// Writes the sources into `dir` and compiles `icount.so` there with `gcc`.
    pub fn build(dir: &Path) -> Result<Self, BenchError> {
        write(&dir.join("icount.c"), PLUGIN_C)?;
        write(&dir.join("qemu-plugin-api.h"), PLUGIN_API_H)?;
        let so = dir.join("icount.so");
        let mut gcc = Command::new("gcc");
        gcc.args(["-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC"])
            .arg("-fvisibility=hidden")
            .arg("-o")
            .arg(&so)
            .arg(dir.join("icount.c"));
        run_tool(gcc, "gcc")?;
        Ok(Self {
            so,
            dir: dir.to_path_buf(),
        })
    }

    /// The `-plugin` argument that writes the count to `out` and, given `blocks`, each
    /// translated block's execution count and instruction offsets there (`symbols.rs`).
    pub fn argument(&self, out: &Path, blocks: Option<&Path>) -> String {
        let mut argument = format!("{},out={}", self.so.display(), out.display());
        if let Some(blocks) = blocks {
            argument.push_str(&format!(",blocks={}", blocks.display()));
        }
        argument
    }

    /// Runs the known loop on `arch` for `passes` and twice as many passes under QEMU with the
    /// plugin and returns both counts.
    pub fn self_test(&self, arch: Arch, passes: u64) -> Result<SelfTest, BenchError> {
        let count = |passes: u64| -> Result<u64, BenchError> {
            let program = self.known_loop(arch, passes)?;
            let out = self
                .dir
                .join(format!("loop-{}-{passes}.count", arch.name()));
            let mut qemu = arch.qemu(self, &out);
            qemu.arg(&program);
            run_tool(qemu, arch.qemu_program())?;
            read_count(&out)
        };
        Ok(SelfTest {
            arch,
            passes,
            short: count(passes)?,
            long: count(2 * passes)?,
        })
    }
}

impl Plugin {
    /// Compiles the known loop for `arch` with `passes` passes; returns the program's path.
    fn known_loop(&self, arch: Arch, passes: u64) -> Result<PathBuf, BenchError> {
        let source = self.dir.join(format!("loop-{}.S", arch.name()));
        write(&source, loop_source(arch))?;
        let program = self.dir.join(format!("loop-{}-{passes}", arch.name()));
        let mut gcc = Command::new(arch.cross_gcc());
        gcc.args(["-nostdlib", "-static"])
            .arg(format!("-DITERATIONS={passes}"))
            .arg("-o")
            .arg(&program)
            .arg(&source);
        run_tool(gcc, arch.cross_gcc())?;
        Ok(program)
    }
}

fn loop_source(arch: Arch) -> &'static str {
    match arch {
        Arch::Aarch64 => LOOP_AARCH64,
        Arch::Armv7 => LOOP_ARMV7,
    }
}

/// The count the plugin wrote to `path` (`insns N`).
pub fn read_count(path: &Path) -> Result<u64, BenchError> {
    let text = std::fs::read_to_string(path).map_err(|source| BenchError::File {
        op: "reading the instruction count",
        path: path.to_path_buf(),
        source,
    })?;
    text.trim()
        .strip_prefix("insns ")
        .and_then(|count| count.parse().ok())
        .ok_or_else(|| BenchError::Parse {
            path: path.to_path_buf(),
        })
}

fn write(path: &Path, text: &str) -> Result<(), BenchError> {
    std::fs::write(path, text).map_err(|source| BenchError::File {
        op: "writing",
        path: path.to_path_buf(),
        source,
    })
}

/// Runs `command` to completion; a failure carries its stderr.
fn run_tool(mut command: Command, program: &str) -> Result<(), BenchError> {
    let output = command.output().map_err(|err| BenchError::Tool {
        program: program.to_owned(),
        message: err.to_string(),
    })?;
    if output.status.success() {
        return Ok(());
    }
    Err(BenchError::Tool {
        program: program.to_owned(),
        message: format!(
            "{}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_known_loop_counts_its_fixed_part_once() {
        assert_eq!(expected_loop_insns(1_000_000), 3_000_004);
        let exact = SelfTest {
            arch: Arch::Armv7,
            passes: 10,
            short: 34,
            long: 64,
        };
        assert!(exact.exact());
        assert!(!SelfTest { long: 65, ..exact }.exact());
    }

    /// Builds the plugin and runs the known loop under qemu-aarch64 and qemu-arm (gcc, the
    /// cross compilers and qemu-user are prerequisites of the test command).
    #[test]
    fn the_plugin_counts_the_known_loop_exactly_on_both_architectures() {
        let dir = std::env::temp_dir().join(format!("tern-bench-plugin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let plugin = Plugin::build(&dir).expect("the plugin compiles");
        for arch in super::super::Arch::ALL {
            let test = plugin
                .self_test(arch, 100_000)
                .expect("the loop runs under QEMU");
            assert_eq!(test.short, expected_loop_insns(100_000), "{test:?}");
            assert_eq!(
                test.long - test.short,
                LOOP_PASS_INSNS * 100_000,
                "{test:?}"
            );
            assert!(test.exact(), "{test:?}");
        }
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    /// The block file of the known loop gives each of its instructions its execution count,
    /// and they add up to the plugin's total.
    #[test]
    fn the_blocks_of_the_known_loop_add_up_to_its_count() {
        let dir = std::env::temp_dir().join(format!("tern-bench-blocks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let plugin = Plugin::build(&dir).expect("the plugin compiles");
        for arch in super::super::Arch::ALL {
            let program = plugin.known_loop(arch, 1000).expect("the loop compiles");
            let (out, blocks) = (dir.join("count"), dir.join("blocks"));
            let mut qemu = Command::new(arch.qemu_program());
            qemu.arg("-plugin")
                .arg(plugin.argument(&out, Some(&blocks)))
                .arg(&program);
            run_tool(qemu, arch.qemu_program()).expect("the loop runs under QEMU");
            let blocks = super::super::symbols::Blocks::read(&blocks).expect("block file");
            let file = program.to_string_lossy().into_owned();
            let counts = &blocks.per_file[&file];
            assert_eq!(
                counts.values().sum::<u64>(),
                read_count(&out).expect("count")
            );
            assert_eq!(read_count(&out).expect("count"), expected_loop_insns(1000));
            let passes = counts.values().filter(|&&count| count == 1000).count();
            assert_eq!(passes as u64, LOOP_PASS_INSNS, "{arch:?}: {counts:?}");
        }
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn the_count_file_is_parsed_or_refused() {
        let dir = std::env::temp_dir().join(format!("tern-bench-count-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("count");
        std::fs::write(&path, "insns 42\n").expect("write");
        assert_eq!(read_count(&path).expect("parses"), 42);
        std::fs::write(&path, "insns x\n").expect("write");
        assert!(read_count(&path).is_err());
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
